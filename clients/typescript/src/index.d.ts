// Types of the wrapper, derived from the generated OpenAPI types: when the server's document changes,
// `npm run generate` changes these too.
import type { Client } from "openapi-fetch";
import type { paths } from "./schema.js";

type Operation<P extends keyof paths, M extends keyof paths[P]> = paths[P][M];
type JsonOf<T> = T extends { content: { "application/json": infer J } } ? J : unknown;
/** A body the document leaves untyped is any JSON object. */
type ObjectOr<T> = unknown extends T ? { [field: string]: unknown } : T;
type Success<O> = O extends { responses: infer R }
  ? JsonOf<R[Extract<keyof R, 200 | 201 | "200" | "201">]>
  : unknown;
type BodyOf<O> = O extends { requestBody?: infer B } ? ObjectOr<JsonOf<NonNullable<B>>> : never;
type QueryOf<O> = O extends { parameters: { query?: infer Q } } ? NonNullable<Q> : never;
/** Every /v1 call may name the calling agent and persona. */
type Identity = { agent_id?: string; persona?: string };

export type SaveMemoryInput = BodyOf<Operation<"/v1/memories", "post">> & Identity & { content?: string };
export type SaveResult = Success<Operation<"/v1/memories", "post">>;
export type SearchInput = BodyOf<Operation<"/v1/search", "post">> & Identity;
export type SearchResponse = Success<Operation<"/v1/search", "post">>;
export type ListQuery = QueryOf<Operation<"/v1/memories", "get">> & Identity;
export type MemoryPage = Success<Operation<"/v1/memories", "get">>;
export type Memory = Success<Operation<"/v1/memories/{memory_id}", "get">>;
export type GetQuery = QueryOf<Operation<"/v1/memories/{memory_id}", "get">> & Identity;
export type ForgetResult = Success<Operation<"/v1/memories/{memory_id}", "delete">>;
export type ForgetOptions = Identity & { reason?: string; purge?: boolean };

export interface EngramClientOptions {
  /** Default: ENGRAM_URL, else http://127.0.0.1:8000. */
  baseUrl?: string;
  /** Default: ENGRAM_API_KEY. */
  apiKey?: string;
  /** Sent as agent_id when a call names none. */
  agentId?: string;
  /** Sent as persona when a call names none. */
  persona?: string;
  fetch?: typeof globalThis.fetch;
}

/** An error answer of engram: the contract's {"error": {"code", "message", "field"?}} with its status. */
export declare class EngramError extends Error {
  readonly status: number;
  readonly code: string;
  readonly field: string | undefined;
  readonly requestId: string | undefined;
  constructor(status: number, body: unknown, requestId?: string | null);
}

export declare class EngramClient {
  constructor(options?: EngramClientOptions);
  /** The generated openapi-fetch client, for the calls the wrapper does not cover. */
  readonly http: Client<paths>;
  saveMemory(input: SaveMemoryInput): Promise<SaveResult>;
  search(input: SearchInput): Promise<SearchResponse>;
  listMemories(query?: ListQuery): Promise<MemoryPage>;
  getMemory(memoryId: string, query?: GetQuery): Promise<Memory>;
  forgetMemory(memoryId: string, options?: ForgetOptions): Promise<ForgetResult>;
}
