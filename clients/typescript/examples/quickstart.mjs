// Save, search, list, get and forget one memory through the client; prints what engram answered.
// ENGRAM_URL and ENGRAM_API_KEY say which engram and which key.
import { EngramClient, EngramError } from "../src/index.js";

const engram = new EngramClient({ agentId: "ts-quickstart" });
const saved = await engram.saveMemory({ content: "invoices are sent on the 1st of each month", tags: ["billing"] });
console.log("saved", JSON.stringify(saved));
const found = await engram.search({ question: "when are invoices sent?" });
console.log("search", JSON.stringify(found.memories.map(({ id, score, text }) => ({ id, score, text }))));
const page = await engram.listMemories({ tags: ["billing"], limit: 5 });
console.log("list", JSON.stringify(page.memories.map((m) => m.id)));
const memory = await engram.getMemory(saved.memory_id);
console.log("get", JSON.stringify({ id: memory.id, kind: memory.kind, agent_id: memory.agent_id }));
console.log("forget", JSON.stringify(await engram.forgetMemory(saved.memory_id, { reason: "quickstart" })));
for (const attempt of [() => engram.getMemory(saved.memory_id), () => engram.saveMemory({ content: "x", importance: 5 })]) {
  try {
    await attempt();
    console.log("error none");
  } catch (error) {
    if (!(error instanceof EngramError)) throw error;
    console.log("error", JSON.stringify({ status: error.status, code: error.code, field: error.field }));
  }
}
