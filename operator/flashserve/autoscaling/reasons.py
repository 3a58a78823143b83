"""The names a decision reports: its reasons, the condition types and reasons it sets, and the SLA states."""

# Decision reasons (CamelCase, for status, Events and the operator's decisions-by-reason metric).
SLA_BREACH = "SLABreach"
TTFT_BREACH = "TTFTBreach"
SLA_AT_RISK = "SLAAtRisk"
SURPLUS_RELEASED = "SurplusReleased"
BELOW_MIN = "BelowMin"
ABOVE_MAX = "AboveMax"
AT_MAX = "AtMax"
HOLD_MISSING_METRICS = "HoldMissingMetrics"
HOLD_STALE_METRICS = "HoldStaleMetrics"
HOLD_NO_READY = "HoldNoReadyReplicas"
HOLD_PENDING = "HoldPendingPods"
HOLD_STARTING = "HoldStartingReplicas"
HOLD_STABILIZING = "HoldStabilizing"
HOLD_SLA_UNREACHABLE = "HoldSLAUnreachable"
HOLD_SURPLUS = "HoldSurplus"
STEADY = "Steady"

# Condition types and their reasons.
METRICS_AVAILABLE = "MetricsAvailable"
SCALING_LIMITED = "ScalingLimited"
METRICS_FRESH = "MetricsFresh"
METRICS_MISSING = "MetricsMissing"
METRICS_STALE = "MetricsStale"
PENDING_PODS = "PendingPods"
AT_MIN = "AtMin"
WITHIN_LIMITS = "WithinLimits"

# SLA states for status.slaState.
SLA_MET, SLA_AT_RISK_STATE, SLA_BREACHED, SLA_UNKNOWN = "Met", "AtRisk", "Breached", "Unknown"
