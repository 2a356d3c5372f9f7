"""The analysis of a config.json as the web tier gets it: from a child process that has torch and transformers
(``workers.engine.analysis.worker``), never from this one, so no page or API request imports them. The child is
started by the first analysis a web process asks for (a few seconds: it imports torch and transformers), answers
the next ones in tens of milliseconds, and exits after D0_ANALYSIS_IDLE_S without one. Plans are made from the
stored analysis (``workers.engine.analysis.plan_from_analysis``) in this process: they need no model build."""

from django.conf import settings

from workers.engine.analysis.worker import AnalysisProcess

_process = AnalysisProcess()


def analyze(config: dict) -> dict:
    """``workers.engine.analysis.analyze(config)``, in the analysis process: raises ConfigError (or ValueError) for
    a config it cannot read, AnalysisFailed when the process crashed or ran past D0_ANALYSIS_TIMEOUT_S."""
    return _process.analyze(config, timeout_s=settings.D0_ANALYSIS_TIMEOUT_S, idle_s=settings.D0_ANALYSIS_IDLE_S)
