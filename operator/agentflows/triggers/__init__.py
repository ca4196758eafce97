"""Triggers: sources that start FlowRuns by themselves.

- :mod:`agentflows.triggers.schedule`: one CronJob per ``schedule`` trigger (``sync_cronjobs``,
  called by the operator's Flow handler) and ``agentflows trigger``, the CronJob pod's command.
- :mod:`agentflows.triggers.webhook`: ``agentflows webhook``, the HMAC-verifying receiver.
- :mod:`agentflows.triggers.kubernetes`: :class:`WatchManager`, the shared watches behind
  ``kubernetes`` triggers (the operator owns one and calls ``sync`` when Flows change).
- :mod:`agentflows.triggers.common`: the FlowRun every trigger creates, rate limits, dedup.

Every triggered FlowRun goes through the Flow's concurrency policy, which the operator applies
when it sees the FlowRun; nothing here decides whether a run may start beyond rate limits and
de-duplication.
"""
