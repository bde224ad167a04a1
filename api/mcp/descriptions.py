"""What each MCP tool tells an agent: when to call it, what it returns, and one example call."""

SAVE_MEMORY = """Save something worth remembering for future runs: a fact, preference, decision, goal, todo,
or a quirk you discovered about the data. Call it at the end of a step when you learned something a later
run would otherwise have to rediscover; do not save scratch work (use category 'conversation' for that).
Link the catalog entities the memory is about so search finds it by entity. Saving with an existing
memory_id replaces that memory (upsert). `learning` is an alias of `content`. Returns {memory_id, entities, warnings}.

category: core (durable, default), daily (expires 72 h after the last write), conversation
(dies with the run), workspace (shared with every agent of the tenant).

Example: {"content": "orders.amount is in cents; divide by 100 for dollars", "kind": "fact",
"linked_entities": ["shop.orders.amount"], "tags": ["units"]}"""

GET_MEMORY = """Recall one memory exactly by its id (from search, list_memories or a previous save), with all
its fields: content, kind, category, tags, entities, associations, times. Use it when you already know
which memory you need; use search when you do not. Unknown or not visible to you: a not_found error.

Example: {"memory_id": "42"}"""

UPDATE_MEMORY = """Revise a memory you (or your user) own, keeping its id and creation time: correct its text,
kind, category, tags, importance, linked entities or associations. Only the fields you give change. Prefer
this over saving a near-duplicate when a fact changed. Returns the updated memory.

Example: {"memory_id": "42", "content": "Bob moved to the Enterprise plan", "tags": ["customer", "plan_enterprise"]}"""

FORGET_MEMORY = """Forget a memory that is wrong, outdated or that the user asked you to forget. It is
excluded from every search, list and recall from then on, and references to it (memory:<id>) are removed
from other memories. Give a short reason for the audit trail. Returns {memory_id, status: "forgotten"}.

Example: {"memory_id": "42", "reason": "user corrected the plan name"}"""

LIST_MEMORIES = """Browse memories with exact filters (kind, category, tags, run, entity, creation time),
newest first or by importance or access count, one page at a time (pass next_cursor for the next page).
Use it to review or clean up what is stored; use search to answer a question.
Returns {memories: [...], next_cursor}.

Example: {"category": "daily", "tags": ["followup"], "sort": "importance", "limit": 20}"""

SEARCH = """Find the memories, example queries and catalog entities relevant to what you are about to do.
Call it first, before planning a query or answering from memory: give a natural-language `question`,
and/or the `entities` you are working with ('shop.orders', 'shop.orders.amount'), and/or your draft
`query`. Full-text, entity overlap, embeddings and the association graph are fused (mode 'hybrid');
modes 'recent', 'important' and 'typed' (with kind) order memories without a question.
Returns {memories, example_queries, entities, resolved_input_entities, warnings, channels, degraded}.

Example: {"question": "how is revenue computed for refunded orders?", "entities": ["shop.orders"]}"""

HYDRATE = """Load your standing context at the start of a run: your most important memories that fit a
byte budget, durable 'core' memories first (newest first), then the newest of the others. Call it once
when you start, then use search for specifics. Returns {memories: [...], bytes}.

Example: {"budget_bytes": 8000}"""

INSPECT_MODEL = """Look at one model (table) of a datasource before querying it: its columns with types,
descriptions and sample values, foreign keys, named measures, aggregations, and the learnings (memories
without a query) saved about it or its columns. Use search first if you do not know the model's name.

Example: {"datasource": "shop", "model": "orders"}"""

INGEST_DATASOURCE = """Re-read a registered datasource's schema (tables become models, columns, keys) and
refresh its sample values, in the background. Call it when the catalog looks out of date, e.g. a table
you know exists is missing from search or inspect_model. Needs an admin key. Returns {job_id}.

Example: {"datasource": "shop"}"""
