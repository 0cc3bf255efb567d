"""The words of a consent question (docs/consent.md, "The prompt (elicitation)"): the copy in each
locale, the arguments as a person reads them, and the elicitation message.

The arguments are shown one per line, `name: value` with the value as canonical JSON, so a long
one cannot push the others out of sight; a value under a secret-looking name is `[redacted]`
(`is_secret_name`, whole words of the name only: `api_key`, `authToken`, not `keyword`). Every
part of the message is `visible`, and what is too long is cut loudly (`visible.excerpt`). When
something is cut, the message says so and the form's choices start with Deny once, its default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.canonical import canonical_json
from gateway.consent.hints import HINT_DEFAULTS, hint, is_given
from gateway.visible import Excerpt, excerpt, visible

REDACTED = "[redacted]"

SECRET_WORDS = frozenset(
    {
        "key", "keys", "apikey", "accesskey", "secretkey", "privatekey",
        "token", "tokens", "authtoken", "accesstoken", "refreshtoken", "idtoken", "sessiontoken", "bearer", "jwt",
        "secret", "secrets", "clientsecret",
        "pass", "passwd", "password", "passwords", "passphrase", "pwd",
        "credential", "credentials", "creds",
        "auth", "authorization", "authentication",
        "session", "sessionid", "cookie", "cookies",
        "private", "cert", "certificate",
    }
)  # fmt: skip
"""A name holding one of these as a whole word is secret-looking: its value is never shown."""

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
"""The words of a name: split at anything not a letter or digit and at camelCase humps."""


def name_words(name: str) -> list[str]:
    """`api_key` -> api, key; `X-Auth-Token` -> x, auth, token; `APIKey` -> api, key; `keyword` -> keyword."""
    return [word.lower() for word in _WORDS.findall(_split_acronym(name))]


def _split_acronym(name: str) -> str:
    # "APIKey": an acronym followed by a capitalised word; put a break before the word.
    return re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)


def is_secret_name(name: str) -> bool:
    words = name_words(name)
    return any(word in SECRET_WORDS for word in words) or "".join(words) in SECRET_WORDS


def redacted(value: Any) -> Any:
    """`value` with everything under a secret-looking name replaced by `[redacted]`, at any depth."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_name(str(k)) else redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def redacted_preview(arguments: Mapping[str, Any]) -> str:
    """The arguments, one `name: value` line each (sorted; the value canonical JSON), secret-looking
    names redacted, every line `visible`. Whole: a channel cuts it for its screen (`excerpt`)."""
    scrubbed = redacted(dict(arguments))
    lines = [f"{visible(str(name))}: {visible(canonical_json(scrubbed[name]))}" for name in sorted(scrubbed, key=str)]
    return "\n".join(lines) if lines else "(none)"


# --- the copy ------------------------------------------------------------------------------------

_COPY: Mapping[str, Mapping[str, str]] = {
    "en-US": {
        "title": "Allow this tool to run?",
        "from": "From {server}",
        "low": "Low risk · read-only",
        "medium": "Medium risk",
        "high": "High risk · may modify data",
        "args": "Arguments",
        "user": "Requested by {user} in workspace {workspace}",
        "ALLOW_ONCE": "Allow once",
        "ALLOW_ALWAYS": "Allow always",
        "DENY_ONCE": "Deny once",
        "DENY_ALWAYS": "Deny always",
        "ALLOW_SESSION": "Allow for this session",
        "cut_line": "[✂ CUT: {hidden} more characters of this line's {total}]",
        "cut_lines": "[✂ CUT: {hidden} more lines of {total}]",
        "cut": "⚠ NOT SHOWN WHOLE: {chars} characters in {lines} lines, sha256 {digest}…",
        "cut_elicitation": "⚠ Part of this request is hidden here: deny unless you have seen all of it.",
        "cut_approver": "⚠ [v] shows all of it; Allow needs that first.",
        "see_all": "see all",
        "see_all_first": "The preview was cut: press [v] to see the whole request before allowing it.",
        "whole": "the whole request: {chars} characters in {lines} lines, sha256 {digest}…",
        "whole_end": "end of the whole request, sha256 {digest}…",
        "upstream": "Upstream server: {upstream} ({trust})",
        "trusted": "trusted",
        "untrusted": "untrusted",
        "hints": "Annotations: {hints}",
        "hint_default": "{name}: {value} (MCP default)",
        "hint_default_unused": "{name}: {value} (MCP default; it means nothing for a read-only tool)",
        "hint_not_boolean": "{name}: {value} (MCP default; the server sent {sent}, not a boolean)",
        "server_title": "The server titles this tool (unchecked): {text}",
        "server_says": "The server describes this tool as (unchecked): {text}",
        "no_description": "(no description)",
    },
    "pt-BR": {
        "title": "Permitir execução desta ferramenta?",
        "from": "Do servidor {server}",
        "low": "Risco baixo · somente leitura",
        "medium": "Risco médio",
        "high": "Risco alto · pode modificar dados",
        "args": "Argumentos",
        "user": "Pedido por {user} no espaço de trabalho {workspace}",
        "ALLOW_ONCE": "Permitir uma vez",
        "ALLOW_ALWAYS": "Permitir sempre",
        "DENY_ONCE": "Negar uma vez",
        "DENY_ALWAYS": "Negar sempre",
        "ALLOW_SESSION": "Permitir nesta sessão",
        "cut_line": "[✂ CORTADO: mais {hidden} caracteres dos {total} desta linha]",
        "cut_lines": "[✂ CORTADO: mais {hidden} linhas de {total}]",
        "cut": "⚠ NÃO MOSTRADO POR INTEIRO: {chars} caracteres em {lines} linhas, sha256 {digest}…",
        "cut_elicitation": "⚠ Parte deste pedido está oculta aqui: negue, a não ser que você o tenha visto inteiro.",
        "cut_approver": "⚠ [v] mostra tudo; Permitir exige isso antes.",
        "see_all": "ver tudo",
        "see_all_first": "A prévia foi cortada: tecle [v] para ver o pedido inteiro antes de permiti-lo.",
        "whole": "o pedido inteiro: {chars} caracteres em {lines} linhas, sha256 {digest}…",
        "whole_end": "fim do pedido inteiro, sha256 {digest}…",
        "upstream": "Servidor upstream: {upstream} ({trust})",
        "trusted": "confiável",
        "untrusted": "não confiável",
        "hints": "Anotações: {hints}",
        "hint_default": "{name}: {value} (padrão do MCP)",
        "hint_default_unused": "{name}: {value} (padrão do MCP; não vale para uma ferramenta somente de leitura)",
        "hint_not_boolean": "{name}: {value} (padrão do MCP; o servidor enviou {sent}, que não é booleano)",
        "server_title": "O servidor intitula esta ferramenta (não verificado): {text}",
        "server_says": "O servidor descreve esta ferramenta como (não verificado): {text}",
        "no_description": "(sem descrição)",
    },
}


def copy_for(locale: str) -> Mapping[str, str]:
    return _COPY.get(locale, _COPY["en-US"])


def cut_notice(part: Excerpt, copy: Mapping[str, str]) -> str:
    return copy["cut"].format(chars=part.chars, lines=part.lines, digest=part.digest)


# --- the elicitation message --------------------------------------------------------------------


class Question(Protocol):
    """What a question names (a `consent.ConsentRequest`)."""

    @property
    def tool_name(self) -> str: ...
    @property
    def server_id(self) -> str: ...
    @property
    def risk(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def workspace(self) -> str: ...
    @property
    def arguments(self) -> Mapping[str, Any]: ...
    @property
    def preview(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    cut: bool
    """Part of the request is not in `text`: Allow must not be the default."""


def body_of(question: Question) -> str:
    """The whole of what a question shows about the call: its preview, else its arguments."""
    if question.preview is not None:
        return visible(question.preview, lines=True)
    return redacted_preview(question.arguments)


def prompt_for(question: Question, locale: str) -> Prompt:
    """The elicitation message: tool, server, risk, who and where, then the arguments (or preview),
    one per line; a cut says so before them."""
    copy = copy_for(locale)
    part = excerpt(body_of(question), copy)
    lines = [
        f"{copy['title']} {visible(question.tool_name)}",
        copy["from"].format(server=visible(question.server_id)),
        copy[question.risk],
        copy["user"].format(user=visible(question.user), workspace=visible(question.workspace)),
    ]
    if part.cut:
        lines += [cut_notice(part, copy), copy["cut_elicitation"]]
    if question.preview is None:
        lines.append(f"{copy['args']}:")
    lines += [f"  {line}" for line in part.text.split("\n")]
    return Prompt("\n".join(lines), part.cut)


def prompt_text(question: Question, locale: str) -> str:
    return prompt_for(question, locale).text


# --- an upstream's tool ------------------------------------------------------------------------


class Upstream(Protocol):
    """Where an upstream's tool comes from (gateway/tools/base.py `Origin`)."""

    @property
    def upstream(self) -> str: ...
    @property
    def trust(self) -> str: ...
    @property
    def description(self) -> str: ...


WRITE_ONLY_HINTS = frozenset({"destructiveHint", "idempotentHint"})
"""Hints MCP gives meaning only for a tool that is not read-only: their defaults do not count for one that is."""
SENT_CHARS = 64
"""At most this much of a hint's value that is not a boolean is shown (it means nothing but its default)."""


def upstream_preview(
    origin: Upstream, annotations: Mapping[str, Any], arguments: Mapping[str, Any], locale: str
) -> str:
    """What every channel shows of a call to an upstream MCP server's tool (docs/upstreams.md, "What a
    person is told"): the upstream and its trust as the policy says them, each behaviour hint (a missing
    one named as its MCP default), the server's title and description marked as its own unchecked words,
    then the arguments as any call's (`redacted_preview`).

    Each of the server's words is one `visible` line (a newline in it is written `\\u000a`), so no text
    of the server's can pass for a line of the gateway's; a line too long is cut loudly where the
    channel shows it (`visible.excerpt`), and the prompt then says it is not shown whole."""
    copy = copy_for(locale)
    trust = copy[str(origin.trust)] if origin.trust in ("trusted", "untrusted") else visible(origin.trust)
    hints = " · ".join(_hint_words(annotations, name, copy) for name in HINT_DEFAULTS)
    lines = [copy["upstream"].format(upstream=visible(origin.upstream), trust=trust), copy["hints"].format(hints=hints)]
    title = annotations.get("title")
    if isinstance(title, str) and title:
        lines.append(copy["server_title"].format(text=visible(title)))
    described = visible(origin.description) if origin.description else copy["no_description"]
    lines.append(copy["server_says"].format(text=described))
    lines.append(f"{copy['args']}:")
    lines += [f"  {line}" for line in redacted_preview(arguments).split("\n")]
    return "\n".join(lines)


def _hint_words(annotations: Mapping[str, Any], name: str, copy: Mapping[str, str]) -> str:
    value = "true" if hint(annotations, name) else "false"
    if is_given(annotations, name):
        return f"{name}: {value}"
    if name not in annotations:
        unused = name in WRITE_ONLY_HINTS and hint(annotations, "readOnlyHint")
        return copy["hint_default_unused" if unused else "hint_default"].format(name=name, value=value)
    try:
        sent = canonical_json(annotations[name])
    except (TypeError, ValueError):
        sent = "?"
    if len(sent) > SENT_CHARS:
        sent = sent[:SENT_CHARS] + "…"
    return copy["hint_not_boolean"].format(name=name, value=value, sent=visible(sent))
