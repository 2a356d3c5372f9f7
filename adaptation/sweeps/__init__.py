"""Tuning sweeps and their benchmark reports: charts, downloads (self-contained HTML, JSON, CSV), the comparison of
two reports, and the sweep the whole adaptation runs."""
