"""The console's words in en-US and pt-BR, chosen from Accept-Language or the person's switch.

A consent question's own words (its title, risk tiers, the five choices) come from
gateway/consent/text.py, the copy the terminal approver and the elicitation form use.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.consent.text import copy_for

LOCALES = ("en-US", "pt-BR")

_WORDS: Mapping[str, Mapping[str, str]] = {
    "en-US": {
        "_lang": "en-US",
        "console": "mcp-gateway console",
        "nav": "Sections",
        "calls": "Invocations",
        "approvals": "Approvals",
        "grants": "Grants",
        "audit": "Audit",
        "runs": "Runs",
        "sign_in": "Sign in",
        "sign_out": "Sign out",
        "user": "User",
        "password": "Password",
        "bad_sign_in": "Wrong user name or password.",
        "too_many": "Too many failed sign-ins: try again in {seconds} s.",
        "signed_in_as": "Signed in as {user} ({role})",
        "pending": "⏳ Waiting",
        "running": "⚙ Running…",
        "reviewing": "👁 Changes to review",
        "done": "✓ Done",
        "error": "✗ Error",
        "cancelled": "⊘ Cancelled",
        "tool_from": "Tool from",
        "arguments": "Arguments",
        "result": "Result",
        "raw_json": "Raw JSON",
        "form_view": "Form view",
        "copy_args": "Copy arguments",
        "copy_result": "Copy full result",
        "show_more": "Show more",
        "show_less": "Show less",
        "copied": "Copied",
        "refused": "Refused {code} ({reason})",
        "retry_note": "The console does not re-run calls: the agent's retry shows as a new card.",
        "no_calls": "No invocations yet.",
        "live": "Live",
        "no_questions": "No question waits for an answer.",
        "time_left": "Answer within {seconds} s",
        "expired": "Expired: the gateway denied it",
        "user_workspace": "Requested by {user} in workspace {workspace}",
        "whole": "Shown whole: {chars} characters in {lines} lines, sha256 {digest}…",
        "review_title": "Apply these changes to the workspace?",
        "changes_size": "changes.patch: {size} bytes, sha256 {digest}…, shown whole below.",
        "changes_cut": "⚠ Not shown whole: changes.patch is {size} bytes (sha256 {digest}…) and only its start is below. Deny unless you have read all of it:",
        "changes_more": "[✂ CUT: {lines} more lines, and the rest of the file if any]",
        "changes_whole": "the whole patch",
        "changes_unreadable": "⚠ The change set cannot be shown ({why}). Deny: allowing would apply changes nobody has seen.",
        "changes_files": "Changed",
        "changes_action": "Action",
        "changes_path": "Path",
        "changes_sizes": "Size (bytes)",
        "changes_modes": "Mode",
        "changes_refused": "Refused (never applied):",
        "changes_patch": "The patch",
        "destructive": "destructive: Allow always is not offered",
        "cannot_decide": "Your role lacks CONSENT_DECIDE: you can see this question, not answer it.",
        "decided": "Recorded: {decision}.",
        "not_recorded": "Not recorded: another approver decided first, it expired, or its gateway is gone.",
        "not_offered": "That choice is not offered for this question.",
        "state": "State",
        "tool": "Tool",
        "filter": "Filter",
        "any": "any",
        "active": "active",
        "revoked": "revoked",
        "revoke": "Revoke",
        "decision": "Decision",
        "workspace": "Workspace",
        "expires": "Expires",
        "granted_by": "Granted by",
        "never": "never",
        "no_grants": "No stored decision matches.",
        "event_type": "Event type",
        "code": "Code",
        "since": "From (ISO time)",
        "until": "Until (ISO time)",
        "older": "Older events",
        "export": "Export JSON Lines",
        "chain_ok": "Hash chain intact: {checked} events verified at {at}.",
        "chain_bad": "Hash chain BROKEN at event {first_bad}: {problem} (verified at {at}).",
        "chain_pending": "Hash chain: being verified…",
        "no_events": "No event matches.",
        "no_runs": "No runs yet.",
        "status": "Status",
        "exit_code": "Exit code",
        "evidence": "Evidence",
        "governance": "Governance",
        "junit": "JUnit summary",
        "not_found": "Not found.",
        "language": "Language",
        "forbidden": "Refused: the form's CSRF token is missing or wrong; reload the page and try again.",
        "when": "When",
        "full_size": "Show the image at full size",
        "sending": "Sending…",
    },
    "pt-BR": {
        "_lang": "pt-BR",
        "console": "console do mcp-gateway",
        "nav": "Seções",
        "calls": "Invocações",
        "approvals": "Aprovações",
        "grants": "Permissões guardadas",
        "audit": "Auditoria",
        "runs": "Execuções",
        "sign_in": "Entrar",
        "sign_out": "Sair",
        "user": "Usuário",
        "password": "Senha",
        "bad_sign_in": "Usuário ou senha incorretos.",
        "too_many": "Tentativas demais: tente de novo em {seconds} s.",
        "signed_in_as": "Conectado como {user} ({role})",
        "pending": "⏳ Aguardando",
        "running": "⚙ Executando…",
        "reviewing": "👁 Alterações a revisar",
        "done": "✓ Concluído",
        "error": "✗ Erro",
        "cancelled": "⊘ Cancelado",
        "tool_from": "Ferramenta de",
        "arguments": "Argumentos",
        "result": "Resultado",
        "raw_json": "JSON bruto",
        "form_view": "Formulário",
        "copy_args": "Copiar argumentos",
        "copy_result": "Copiar resultado inteiro",
        "show_more": "Mostrar mais",
        "show_less": "Mostrar menos",
        "copied": "Copiado",
        "refused": "Recusada {code} ({reason})",
        "retry_note": "O console não executa chamadas de novo: a nova tentativa do agente aparece como outro cartão.",
        "no_calls": "Nenhuma invocação ainda.",
        "live": "Ao vivo",
        "no_questions": "Nenhuma pergunta aguarda resposta.",
        "time_left": "Responda em {seconds} s",
        "expired": "Expirou: o gateway negou",
        "user_workspace": "Pedido por {user} no espaço de trabalho {workspace}",
        "whole": "Mostrado por inteiro: {chars} caracteres em {lines} linhas, sha256 {digest}…",
        "review_title": "Aplicar estas mudanças ao espaço de trabalho?",
        "changes_size": "changes.patch: {size} bytes, sha256 {digest}…, mostrado por inteiro abaixo.",
        "changes_cut": "⚠ Não mostrado por inteiro: changes.patch tem {size} bytes (sha256 {digest}…) e só o início está abaixo. Negue, a não ser que você o tenha lido inteiro:",
        "changes_more": "[✂ CORTADO: mais {lines} linhas, e o resto do arquivo se houver]",
        "changes_whole": "o patch inteiro",
        "changes_unreadable": "⚠ O conjunto de mudanças não pode ser mostrado ({why}). Negue: permitir aplicaria mudanças que ninguém viu.",
        "changes_files": "Mudanças",
        "changes_action": "Ação",
        "changes_path": "Caminho",
        "changes_sizes": "Tamanho (bytes)",
        "changes_modes": "Modo",
        "changes_refused": "Recusados (nunca aplicados):",
        "changes_patch": "O patch",
        "destructive": "destrutiva: Permitir sempre não é oferecido",
        "cannot_decide": "Seu papel não tem CONSENT_DECIDE: você vê esta pergunta, mas não pode respondê-la.",
        "decided": "Registrado: {decision}.",
        "not_recorded": "Não registrado: outro aprovador decidiu antes, expirou, ou o gateway que perguntou sumiu.",
        "not_offered": "Essa escolha não é oferecida para esta pergunta.",
        "state": "Estado",
        "tool": "Ferramenta",
        "filter": "Filtrar",
        "any": "qualquer",
        "active": "ativa",
        "revoked": "revogada",
        "revoke": "Revogar",
        "decision": "Decisão",
        "workspace": "Espaço de trabalho",
        "expires": "Expira",
        "granted_by": "Concedida por",
        "never": "nunca",
        "no_grants": "Nenhuma decisão guardada corresponde.",
        "event_type": "Tipo de evento",
        "code": "Código",
        "since": "De (hora ISO)",
        "until": "Até (hora ISO)",
        "older": "Eventos anteriores",
        "export": "Exportar JSON Lines",
        "chain_ok": "Cadeia de hashes íntegra: {checked} eventos verificados em {at}.",
        "chain_bad": "Cadeia de hashes QUEBRADA no evento {first_bad}: {problem} (verificada em {at}).",
        "chain_pending": "Cadeia de hashes: verificando…",
        "no_events": "Nenhum evento corresponde.",
        "no_runs": "Nenhuma execução ainda.",
        "status": "Situação",
        "exit_code": "Código de saída",
        "evidence": "Evidência",
        "governance": "Governança",
        "junit": "Resumo JUnit",
        "not_found": "Não encontrado.",
        "language": "Idioma",
        "forbidden": "Recusado: o token CSRF do formulário falta ou está errado; recarregue a página e tente de novo.",
        "when": "Quando",
        "full_size": "Mostrar a imagem em tamanho real",
        "sending": "Enviando…",
    },
}


def words_for(locale: str) -> dict[str, str]:
    """The console's words and the consent questions' (gateway/consent/text.py) for `locale`."""
    chosen = locale if locale in _WORDS else "en-US"
    return {**copy_for(chosen), **_WORDS[chosen]}


def pick_locale(chosen: str | None, accept_language: str | None) -> str:
    """The person's switch if they used it, else the first of Accept-Language the console speaks."""
    if chosen in LOCALES:
        return str(chosen)
    ranked: list[tuple[float, int, str]] = []
    for i, part in enumerate((accept_language or "").split(",")):
        tag, _, params = part.strip().partition(";")
        quality = 1.0
        if params.strip().startswith("q="):
            try:
                quality = float(params.strip()[2:])
            except ValueError:
                quality = 0.0
        ranked.append((-quality, i, tag.strip().lower()))
    for _, _, tag in sorted(ranked):
        if tag.startswith("pt"):
            return "pt-BR"
        if tag.startswith("en"):
            return "en-US"
    return "en-US"
