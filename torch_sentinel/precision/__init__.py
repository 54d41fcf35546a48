"""Low-precision headroom: how each module's activations and gradients fare in bf16, fp16 and
float8 (e4m3, e5m2), from one magnitude histogram per tensor on sampled steps.

=============  ==============================================================================
module         what
=============  ==============================================================================
``formats``    the formats and their rounding edges (round-to-nearest-even, as ``.to(dtype)``)
``layout``     the histogram's bins: binades of float32 magnitudes, split at every edge
``histogram``  device side: a tensor into its histogram row (tensor ops only, traceable)
``probe``      the probe adapter: outputs and gradients of sampled steps into a device buffer;
               publishes the rows as the ``PrecisionRows`` fact
``derive``     host side: flushed / subnormal / saturated / amax / headroom from a histogram
``trend``      host side: when ``amax`` will pass a limit (log-linear fit over samples)
``monitor``    host side: samples in, :class:`PrecisionRow` s out
=============  ==============================================================================

See ``docs/precision.md``.
"""

from .formats import FORMATS, Format, canonical_format
from .monitor import PrecisionMonitor, PrecisionRow
from .probe import PrecisionProbe, PrecisionRows

__all__ = ["FORMATS", "Format", "PrecisionMonitor", "PrecisionProbe", "PrecisionRow", "PrecisionRows",
           "canonical_format"]
