"""Running engram's processes: the whole stack on one machine (:mod:`api.serve.stack`) and the
restart-on-death supervisor of a single child (:mod:`api.serve.supervise`)."""
