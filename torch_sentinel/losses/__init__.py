"""The loss contracts: what every torch loss takes, checked on the device, judged at flush.

- ``contracts.py``: the table, one declarative entry per loss in ``torch.nn``/``torch.nn.functional``;
- ``calls.py``: a call's host facts (shapes, keywords, the producing op, the call site);
- ``checks.py``: the clauses' figures on the device (tensors in, a few device scalars out);
- ``verdicts.py`` and ``messages.py``: figures to verdicts and their words, on the host.

The probe that observes the calls is ``_collect/loss_inputs.py``; the detectors that report the
verdicts are ``detectors/loss_contracts.py``, ``probabilities_as_logits.py`` and
``loss_broadcast.py``. This package sits beside both (as ``shapes/`` does) because both read the
table: it imports torch only, so neither side imports the other through it.
"""

from __future__ import annotations

from .contracts import CLAUSES, CONTRACTS, Contract, by_function, by_module

__all__ = ["CLAUSES", "CONTRACTS", "Contract", "by_function", "by_module"]
