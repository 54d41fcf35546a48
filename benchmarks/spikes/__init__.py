"""Loss-spike forensics benchmark (issue 23): injected spikes on a small GPT, the sentinel's
``loss_spike`` finding beside four published spike detectors replayed on the same loss traces.
See ``docs/spikes.md``."""
