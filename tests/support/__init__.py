"""What the tests and the benchmarks share: waiting for a condition (``waiting``), the small store files
members start with (``stores``), both ways of storing prepared records (``apply_paths``), groups of member
processes that are always cleaned up (``process_group``) and percentiles of measured latencies
(``percentiles``)."""
