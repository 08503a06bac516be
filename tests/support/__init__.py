"""What the tests and the benchmarks share: waiting for a condition (``waiting``), the small store files
members start with (``stores``), both ways of storing prepared records (``apply_paths``) and groups of member
processes that are always cleaned up (``process_group``). Percentiles of measured values are the client's
(``client.figures.percentile``), the rule every report uses."""
