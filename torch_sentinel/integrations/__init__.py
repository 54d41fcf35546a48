"""One-line integrations with training frameworks; each is an optional extra.

- :mod:`torch_sentinel.integrations.lightning`: ``SentinelCallback`` for a Lightning ``Trainer``
  (``pip install torch_sentinel[lightning]``).
- :mod:`torch_sentinel.integrations.transformers`: ``SentinelTrainerCallback`` for the Hugging Face
  ``Trainer`` (``pip install torch_sentinel[transformers]``).

Neither module is imported here, so importing torch_sentinel never imports a framework.
"""
