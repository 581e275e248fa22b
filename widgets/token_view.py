"""One call's tokens as HTML: the completion coloured token by token, the prompt collapsed above it.

``colour_by="owner"`` colours each completion token by its ``workbench.store.TokenOwner`` code:
trained (for the call's policy) / masked / tool output / another role's text. ``"logprob"`` and
``"advantage"`` colour it on a heat scale instead: the engine's logprob (white at 0, red at
``LOGPROB_FLOOR`` and below) or the advantage the token was trained with (blue negative, red
positive, saturating at ``ADVANTAGE_SCALE``; tokens not trained on stay grey). A legend explains
the colours; each token's tooltip (``title``) gives its position, id, owner and logprob.

Markup a browser test can rely on: ``<div class="wb-tokens" data-call=ID data-colour-by=...>`` holding
``.wb-token-legend``, a ``<details class="wb-prompt">`` with the prompt's tokens (``<span class="ptok">``)
and ``.wb-completion`` with one ``<span class="tok owner-N tok-NAME" data-owner="N" data-i="I">`` per
completion token (NAME: trained, masked, tool, other-role). Model output is untrusted: every text and
attribute is escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from widgets.token_text import CallTokens
from workbench.store import TokenOwner

COLOURINGS = ("owner", "logprob", "advantage")
OWNER_COLOURS = {
    TokenOwner.TRAINABLE: "#b9e4bc",
    TokenOwner.MASKED: "#e4e4e4",
    TokenOwner.TOOL: "#ffe9a8",
    TokenOwner.OTHER_ROLE: "#cfe0fc",
}
OWNER_NAMES = {
    TokenOwner.TRAINABLE: "trained",
    TokenOwner.MASKED: "masked",
    TokenOwner.TOOL: "tool output",
    TokenOwner.OTHER_ROLE: "another role",
}
#: Short names in the tokens' CSS classes (``tok-trained`` ...).
OWNER_CLASSES = {
    TokenOwner.TRAINABLE: "trained",
    TokenOwner.MASKED: "masked",
    TokenOwner.TOOL: "tool",
    TokenOwner.OTHER_ROLE: "other-role",
}
UNKNOWN_COLOUR = "#ffffff"
NEUTRAL_COLOUR = "#eeeeee"
#: Logprobs at or below this are full red on the logprob scale.
LOGPROB_FLOOR = -5.0
#: Advantages at or beyond +-this are full red / full blue on the advantage scale.
ADVANTAGE_SCALE = 2.0
#: Prompt tokens shown as spans; a longer prompt shows its last ones (what the model read last).
PROMPT_TOKENS_SHOWN = 2000
#: Completion tokens shown as spans; the rest are counted.
COMPLETION_TOKENS_SHOWN = 16384

_esc = html.escape


def _mix(white: float, red: int, green: int, blue: int) -> str:
    """``rgb()`` of the colour (red, green, blue) faded towards white by ``white`` in [0, 1]."""
    white = min(max(white, 0.0), 1.0)
    channels = [round(c + (255 - c) * white) for c in (red, green, blue)]
    return "rgb({},{},{})".format(*channels)


def logprob_colour(logprob: float | None) -> str:
    """White for a certain token (logprob 0), red at ``LOGPROB_FLOOR`` and below; grey when unknown."""
    if logprob is None or math.isnan(logprob):
        return NEUTRAL_COLOUR
    return _mix(1.0 - min(-logprob, -LOGPROB_FLOOR) / -LOGPROB_FLOOR, 229, 57, 53)


def advantage_colour(advantage: float | None) -> str:
    """Blue for a negative advantage, red for a positive one, white at 0; grey when none applies."""
    if advantage is None or math.isnan(advantage):
        return NEUTRAL_COLOUR
    strength = min(abs(advantage) / ADVANTAGE_SCALE, 1.0)
    return _mix(1.0 - strength, 229, 57, 53) if advantage > 0 else _mix(1.0 - strength, 30, 100, 220)


def owner_name(owner: int, policy: str | None = None) -> str:
    try:
        name = OWNER_NAMES[TokenOwner(owner)]
    except ValueError:
        return f"owner {owner}"
    return f"{name} ({policy})" if owner == TokenOwner.TRAINABLE and policy else name


def _owner_class(owner: int) -> str:
    try:
        return OWNER_CLASSES[TokenOwner(owner)]
    except ValueError:
        return "unknown"


def _owner_colour(owner: int) -> str:
    try:
        return OWNER_COLOURS[TokenOwner(owner)]
    except ValueError:
        return UNKNOWN_COLOUR


def _swatch(colour: str, label: str) -> str:
    return (
        f'<span class="wb-swatch" style="background:{colour};padding:0 6px;margin-right:8px;'
        f'border:1px solid #ccc">{_esc(label)}</span>'
    )


def legend(colour_by: str, policy: str | None = None) -> str:
    """The legend of a colouring, as HTML."""
    if colour_by == "owner":
        items = [_swatch(OWNER_COLOURS[o], owner_name(o, policy)) for o in OWNER_COLOURS]
    elif colour_by == "logprob":
        items = [
            _swatch(logprob_colour(0.0), "logprob 0"),
            _swatch(logprob_colour(LOGPROB_FLOOR / 2), f"{LOGPROB_FLOOR / 2:g}"),
            _swatch(logprob_colour(LOGPROB_FLOOR), f"≤ {LOGPROB_FLOOR:g}"),
            _swatch(NEUTRAL_COLOUR, "no logprob"),
        ]
    else:
        items = [
            _swatch(advantage_colour(-ADVANTAGE_SCALE), f"advantage ≤ {-ADVANTAGE_SCALE:g}"),
            _swatch(advantage_colour(0.0), "0"),
            _swatch(advantage_colour(ADVANTAGE_SCALE), f"≥ +{ADVANTAGE_SCALE:g}"),
            _swatch(NEUTRAL_COLOUR, "not trained"),
        ]
    return f'<div class="wb-token-legend" style="margin:2px 0 4px 0">{"".join(items)}</div>'


def _token_advantages(call: CallTokens) -> list[float | None]:
    """The advantage each completion token was trained with (None for tokens not trained on)."""
    n = len(call.completion_ids)
    per_token = call.token_advantages if call.token_advantages is not None else [call.advantage] * n
    owners = call.owners
    return [
        per_token[i] if i < len(per_token) and i < len(owners) and owners[i] == TokenOwner.TRAINABLE else None
        for i in range(n)
    ]


def _fmt(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.3f}"


def completion_spans(call: CallTokens, colour_by: str = "owner", limit: int = COMPLETION_TOKENS_SHOWN) -> str:
    """The completion's tokens as ``<span class="tok ...">`` elements."""
    if colour_by not in COLOURINGS:
        raise ValueError(f"colour by {colour_by!r}: choose one of {', '.join(COLOURINGS)}")
    n = len(call.completion_ids)
    logprobs: Sequence[float | None] = call.logprobs if call.logprobs is not None else [None] * n
    advantages = _token_advantages(call) if colour_by == "advantage" else [None] * n
    spans = []
    for i in range(min(n, limit)):
        owner = call.owners[i] if i < len(call.owners) else int(TokenOwner.TRAINABLE)
        logprob = logprobs[i] if i < len(logprobs) else None
        if colour_by == "owner":
            colour = _owner_colour(owner)
        elif colour_by == "logprob":
            colour = logprob_colour(logprob)
        else:
            colour = advantage_colour(advantages[i])
        tip = (
            f"#{i} · id {call.completion_ids[i]} · {owner_name(owner, call.policy)} · logprob {_fmt(logprob)}"
        )
        if colour_by == "advantage":
            tip += f" · advantage {_fmt(advantages[i])}"
        spans.append(
            f'<span class="tok owner-{owner} tok-{_owner_class(owner)}" data-owner="{owner}" data-i="{i}" '
            f'title="{_esc(tip)}" style="background:{colour}">{_esc(call.completion_tokens[i])}</span>'
        )
    if n > limit:
        spans.append(f'<span class="wb-more"> … {n - limit} more tokens not shown</span>')
    return "".join(spans)


def prompt_spans(call: CallTokens, limit: int = PROMPT_TOKENS_SHOWN) -> str:
    """The prompt's tokens (its last ``limit``) as ``<span class="ptok">`` elements."""
    n = len(call.prompt_ids)
    start = max(0, n - limit)
    spans = [f'<span class="wb-more">… {start} earlier tokens not shown … </span>'] if start else []
    spans += [
        f'<span class="ptok" data-i="{i}" title="#{i} · id {call.prompt_ids[i]}">{_esc(call.prompt_tokens[i])}</span>'
        for i in range(start, n)
    ]
    return "".join(spans)


def tokens_html(call: CallTokens, colour_by: str = "owner") -> str:
    """One call's token view: legend, prompt (collapsed) and the coloured completion."""
    if colour_by not in COLOURINGS:
        raise ValueError(f"colour by {colour_by!r}: choose one of {', '.join(COLOURINGS)}")
    mono = "font-family:monospace;font-size:12px;line-height:1.7;white-space:pre-wrap;word-break:break-word"
    if call.prompt_ids:
        prompt = prompt_spans(call)
    else:  # no ids stored: the text is all there is
        prompt = f'<span class="ptok-text">{_esc(call.prompt_text)}</span>'
    note = "" if call.decoded else " · token ids shown: the run's tokenizer could not be loaded"
    return (
        f'<div class="wb-tokens" data-call="{call.call_id}" data-colour-by="{_esc(colour_by)}">'
        f"{legend(colour_by, call.policy)}"
        f'<details class="wb-prompt"><summary>prompt · {len(call.prompt_ids)} tokens{_esc(note)}</summary>'
        f'<div class="wb-prompt-tokens" style="{mono};color:#555">{prompt}</div></details>'
        f'<div class="wb-completion" style="{mono}">{completion_spans(call, colour_by)}</div>'
        "</div>"
    )
