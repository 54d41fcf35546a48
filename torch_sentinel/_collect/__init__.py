"""Collection on the device: tensors in, tensors out, never a host read.

Hooks reduce what they see into preallocated slots of the :class:`Ledger`'s current row. At the
end of each optimizer step the row travels to pinned host memory without blocking
(:class:`HostRing`), and the host reads it only once its copy has completed. The one place that
may read a device value synchronously is :func:`read_now`, used by immediate mode on accelerators
and by the cold path that confirms a fault.
"""
