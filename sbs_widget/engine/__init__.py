"""Running both sides in lockstep.

Public (re-exported by ``sbs_widget``): ``entry`` (``prepare``, ``run_aligned``, ``Prepared``),
``tolerance`` (``Tolerance``), ``runtimes`` (``Runtime``, ``get_runtime``), ``user_metrics`` (the names
``metrics=`` takes), ``coverage``. The rest is internal, in flow order: ``prepared`` (the pair made
ready: ``schedule``, ``pair_cache``, ``record_plan``, ``names``), the run's parts (``run_parts``:
``fx_side``, ``onnx_side``, ``measure``, ``verdicts``, ``local_runs``, ``inner_run``, over one
``run_state``), ``lockstep`` stepping them (``segment_records``, ``edge_records``, ``restart``), and the
helpers they use (``fx_runner``, ``segments``, ``node_local``, ``metrics``, ``noise``, ``reference``,
``weights``, ``cancel``, ``background``, ``memory``). ``docs/design.md`` opens with the call tree."""
