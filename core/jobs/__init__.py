"""Jobs: the transactional outbox, its dispatch to the workers, and running a job.

How a committed job reaches a worker. There are three paths; exactly one is the design:

1. **The outbox relay (core.jobs.relay) is THE dispatch path.** A write commits its job rows; an AFTER
   INSERT trigger on ``jobs`` sends ``NOTIFY engram_jobs``; a relay thread in every worker process claims
   rows that are ``queued`` with no ``dispatched_at`` (``FOR UPDATE SKIP LOCKED``, so two relays never
   publish one row) and publishes them to Celery. Writers never touch the broker, and a job committed
   while Redis is down is published when it returns. Anything that wants a job (re)run sets it
   ``queued`` with ``dispatched_at`` NULL and lets the relay take it. Jobs it claims together that may
   run together (a tenant's embed jobs, core.jobs.batches) go out as one message, and while writes keep
   coming it lingers between rounds (``ENGRAM_OUTBOX_LINGER_SECONDS``) so a stream of saves travels in a
   few messages a second; the runner claims a message's jobs in one statement and runs them as one batch.
   The claim is fair: two lanes (``lanes``: interactive for a fresh save's embedding, bulk for the rest,
   each its own Celery queue and worker process), each with a cap on jobs in flight over the cluster,
   refilled round-robin over tenants whenever a job finishes (a finished job notifies too), so one
   tenant's backlog waits in PostgreSQL rather than in Redis ahead of everyone else's work; per-tenant
   caps for ingest and sample refresh; reindex jobs held while paused or over their rate
   (core.embeddings.reindex).
2. The after-commit hook (core.jobs.service.dispatch_outbox) is only a shortcut: a process that installed
   a :class:`~core.jobs.service.JobQueue` (the in-process client, MCP over stdio) also publishes its own
   committed job ids at once. Workers do not: their jobs would pass the fair claim. It may be absent or
   fail; nothing relies on it, and a job it and the relay both publish runs once (workers.runner skips
   a running job).
3. Reconcile (core.jobs.service.jobs_to_redispatch, on beat) is the safety net, not a dispatcher: it
   re-queues jobs whose message was lost after the relay claimed them, jobs whose worker died past the
   running lease, and jobs whose retry (``dispatched_at`` in the future) has come due.

Modules: ``models`` (the row), ``service`` (enqueue, outbox hook, retry, reconcile query), ``relay``,
``lanes`` (interactive or bulk), ``operations`` (an operator's bulk retry, discard, cancel), ``batches``
(which jobs travel and run together), ``queries`` (reads for the API and dashboard). Running a job is the
workers' part, above every domain: ``workers.runner`` (claim, run, backoff) and ``workers.handlers`` (the
table of what each kind does).
"""
