"""Measuring an int8 model against its fp32 original.

errors.py        the streaming error metrics per output (`evaluate`), the calibtool `error` contract
feedback.py      a recurrent state fed back in the evaluation: rows in order, each model carrying its own
tasks.py         task metrics (classification, dense, decision, image, custom) fed the same batches
task_pick.py     which output a task reads: what the fp32 graph says, and task=auto's rules (`resolve`)
tensor_stats.py  per-tensor diagnostics of one job: streamed statistics of every quantised tensor (the QDQ pairs
                 come from calibrun.model.pairs)
diagnosis.py     each tensor's verdict (overflow, clipping, mixed, coarse, sound) and the model's diagnosis: the
                 culprits
verdict.py       the job's headline verdict, ok / degraded / broken, from what the int8 model does
sweep_diagnosis.py  the sweep-level diagnosis the aggregator writes: per run, and would more samples help
rows_apart.py    whether the model's output for a row depends on the rows fed beside it (frames of one sequence)
"""
