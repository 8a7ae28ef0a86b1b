"""Continuing a generation a phase cut short, the pure part (client/continuing/ sends it).

- `planning`: what a continuable request asked for (`Plan`, read once from its body), each part's
  body, and which route a part goes to (`PART_PATH`: a chat is continued on /v1/completions).
- `joining`: the parts of one choice joined (`Joined`: tokens, text, logprobs, weight-version
  spans), a stop string that straddles a cut, the answer's usage and its choice as the client
  gets it.
"""

from .planning import ABORT, CHAT, COMPLETIONS, GENERATE, PART_PATH, Plan, aborted, plan

__all__ = ["ABORT", "CHAT", "COMPLETIONS", "GENERATE", "PART_PATH", "Plan", "aborted", "plan"]
