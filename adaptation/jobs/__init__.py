"""Adaptation jobs and their stage runs: submitting, dispatching stages to nodes, the nodes' reports, cancel and
retry, the whole adaptation in one job, and the pages and API that follow a job live."""
