// Type-checked by `npm run typecheck`: how a TypeScript program uses the client.
import { EngramClient, EngramError } from "../src/index.js";

export async function remember(engram: EngramClient): Promise<void> {
  const saved = await engram.saveMemory({ content: "orders.amount is in cents", tags: ["units"] });
  const hits = await engram.search({ question: "what unit is the order amount in?" });
  const page = await engram.listMemories({ limit: 10 });
  try {
    await engram.getMemory("no-such-memory");
  } catch (error) {
    if (error instanceof EngramError && error.status === 404) console.log(error.code);
  }
  const forgotten = await engram.forgetMemory(saved.memory_id, { reason: "example" });
  const first: string | undefined = hits.memories?.[0]?.text;
  const ids: string[] = page.memories.map((memory) => memory.id);
  console.log(forgotten.status, first, ids);
}
