"""Proof for the low-precision headroom (``torch_sentinel/precision/``, issue 23 part B).

```
python -m benchmarks.precision              # ~6 minutes on 2 quiet CPU cores
python -m benchmarks.precision --quick      # a smoke run: fewer tensors, runs and steps
```

Six parts, each in its own module:

- ``exactness``: flushed / subnormal / saturated from the histogram against counts on torch's
  own cast (``x.to(dtype)``), 4 formats x 1,000 tensors of widely varied scale, shape,
  distribution and input dtype: the largest difference per format and figure.
- ``estimate``: the share of flushed values estimated for tensors already rounded to fp16 (an
  fp16 gradient), against the true share, for three distributions at four scales.
- ``prediction``: 10 runs whose activations grow x1.1 a step, each to overflow fp16 at a
  different step (45 to 135): the step ``precision_overflow`` was concluded at, its predicted
  overflow step, and the step the activations really overflowed (checked on every step).
- ``overhead``: the sentinel with every format watched against the same sentinel with
  ``precision=()`` and the bare loop, step by step interleaved, over the first 100 steps and
  in the steady state after them, at the default sampling.
- ``device_cost``: nanoseconds per element of one histogram, against ``frexp`` + ``bincount``,
  ``torch.bucketize`` and one ``aminmax``.
- ``host reads``: device-to-host reads counted at the dispatcher (``count_host_syncs``) over
  sampled and ordinary steps, with and without the precision probe.

Writes ``benchmarks/results/precision-cpu.json`` and ``precision-cpu.md`` (the tables).
"""
