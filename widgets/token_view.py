"""One call's completion as HTML, token by token, coloured by who owns each token or by a heat scale.

``by="owner"``: trained (for the call's policy) / masked / tool output / another role's text, the codes
of ``workbench.store.TokenOwner``. ``by="logprob"`` or ``by="advantage"``: a blue-to-red heat scale.
Every token is a ``<span class="tok owner-N" data-owner="N">`` with its id, logprob and owner in the
tooltip; all text is escaped (model output is untrusted).
"""

from __future__ import annotations

import html

from widgets.run_queries import CallTokens
from workbench.store import TokenOwner

OWNER_COLOURS = {
    TokenOwner.TRAINABLE: "#c8e6c9",
    TokenOwner.MASKED: "#e0e0e0",
    TokenOwner.TOOL: "#fff3b0",
    TokenOwner.OTHER_ROLE: "#d0e4ff",
}
OWNER_NAMES = {
    TokenOwner.TRAINABLE: "trained",
    TokenOwner.MASKED: "masked",
    TokenOwner.TOOL: "tool output",
    TokenOwner.OTHER_ROLE: "another role",
}
COLOURINGS = ("owner", "logprob", "advantage")


def _heat(value: float, low: float, high: float) -> str:
    """Blue (low) through white to red (high)."""
    t = 0.5 if high <= low else min(max((value - low) / (high - low), 0.0), 1.0)
    if t < 0.5:
        k = int(255 * t * 2)
        return f"rgb({k},{k},255)"
    k = int(255 * (1 - t) * 2)
    return f"rgb(255,{k},{k})"


def legend(by: str, policy: str | None = None) -> str:
    if by == "owner":
        items = [
            f'<span class="tok-legend" style="background:{OWNER_COLOURS[o]}">'
            f"{html.escape(OWNER_NAMES[o] + (f' ({policy})' if o == TokenOwner.TRAINABLE and policy else ''))}"
            "</span>"
            for o in OWNER_COLOURS
        ]
        return " ".join(items)
    return (
        f'<span class="tok-legend">{by}: <span style="background:{_heat(0, 0, 1)}">low</span> '
        f'<span style="background:{_heat(1, 0, 1)}">high</span></span>'
    )


def tokens_html(call: CallTokens, by: str = "owner") -> str:
    """The completion's tokens as coloured spans, with a legend above."""
    if by not in COLOURINGS:
        raise ValueError(f"colour by {by!r}: choose one of {', '.join(COLOURINGS)}")
    n = len(call.completion_ids)
    values: list[float] = []
    if by == "logprob":
        values = call.logprobs or [0.0] * n
    elif by == "advantage":
        values = call.token_advantages or [call.advantage or 0.0] * n
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if by == "advantage":
        low, high = -max(abs(low), abs(high), 1e-9), max(abs(low), abs(high), 1e-9)
    spans = []
    for i, token in enumerate(call.tokens):
        owner = call.owners[i] if i < len(call.owners) else int(TokenOwner.TRAINABLE)
        logprob = call.logprobs[i] if i < len(call.logprobs) else None
        colour = (
            OWNER_COLOURS.get(TokenOwner(owner), "#fff") if by == "owner" else _heat(values[i], low, high)
        )
        tip = f"id {call.completion_ids[i]} · {OWNER_NAMES.get(TokenOwner(owner), owner)}"
        if logprob is not None:
            tip += f" · logprob {logprob:.3f}"
        if by == "advantage":
            tip += f" · advantage {values[i]:.3f}"
        spans.append(
            f'<span class="tok owner-{owner}" data-owner="{owner}" title="{html.escape(tip)}" '
            f'style="background:{colour};white-space:pre-wrap">{html.escape(token)}</span>'
        )
    return (
        f'<div class="tok-legend-row">{legend(by, call.policy)}</div>'
        f'<div class="tokens" style="font-family:monospace;line-height:1.6">{"".join(spans)}</div>'
    )
