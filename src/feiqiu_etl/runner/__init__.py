"""The runner executes a :class:`~feiqiu_etl.plan.model.RunPlan`: :class:`FlowRunner` (the run),
:class:`LaneRunner` (one token's lane, its stores sharing it fairly), :class:`TaskExecutor` (one task)
and the results with the one place where statuses combine (:mod:`.results`); :mod:`.launch` turns options
into a finished run. Import from the modules (``feiqiu_etl.runner.flow_runner``, ``.lane``, ``.results``,
``.launch``): this package imports none of them, so the command line loads the runner only when it runs one."""
