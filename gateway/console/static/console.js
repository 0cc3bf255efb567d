// The console's own script (no third party). Data reaches the page only through textContent and
// attribute setters: never innerHTML. Every text in the cards comes escaped by the console
// (gateway/console/shown.py: bidi, invisible and control characters as \uXXXX). See docs/console.md.
"use strict";

(function () {
  const words = JSON.parse(document.getElementById("words").textContent);
  const STATES = ["pending", "running", "reviewing", "done", "error", "cancelled"];
  const MAX_CHARS = 2000;
  const MAX_LINES = 30;
  const RUNNING_DWELL_MS = 600;
  const ARTIFACT_PREFIX = "mcp-gateway://runs/";

  function node(tag, attrs, ...children) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      element.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  function copyButton(label, text) {
    const button = node("button", { type: "button", class: "copy" }, label);
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(text());
        button.textContent = words.copied;
      } catch (e) {
        button.textContent = label + " ✗";
      }
      setTimeout(() => { button.textContent = label; }, 1500);
    });
    return button;
  }

  // --- invocation cards (docs/console.md, "Invocations: the cards") ----------------------------

  const cardsRoot = document.getElementById("cards");
  let schemas = {};
  const shown = new Map(); // run_id -> {element, status, queue, timer}

  function badgeText(status) {
    return words[status] || status;
  }

  function setBadge(entry, status) {
    entry.status = status;
    entry.element.dataset.status = status;
    const badge = entry.element.querySelector(".badge");
    badge.dataset.status = status;
    badge.querySelector(".label").textContent = badgeText(status);
    const result = entry.element.querySelector("details.result");
    if (result && status === "done") result.open = true; // auto-expand on success, collapsed on error
  }

  // pending -> running -> done: "running" is never skipped on the way to done.
  function advance(entry, status) {
    entry.queue.push(...(status === "done" && entry.status === "pending" ? ["running", "done"] : [status]));
    if (!entry.timer) step(entry);
  }

  function step(entry) {
    const next = entry.queue.shift();
    if (next === undefined) { entry.timer = null; return; }
    setBadge(entry, next);
    entry.timer = setTimeout(() => step(entry), next === "running" ? RUNNING_DWELL_MS : 0);
  }

  function formView(toolName, args) {
    const schema = (schemas[toolName] || {}).inputSchema || {};
    const properties = schema.properties || {};
    const required = new Set(schema.required || []);
    const form = node("form", { class: "form-view", "aria-label": words.form_view });
    for (const [name, prop] of Object.entries(properties)) {
      const id = "f-" + Math.random().toString(36).slice(2);
      const value = args && Object.prototype.hasOwnProperty.call(args, name) ? args[name] : undefined;
      const label = node("label", { for: id }, name, required.has(name) ? " *" : "");
      let input;
      if (Array.isArray(prop.enum)) {
        input = node("select", { id, disabled: true });
        for (const option of prop.enum) {
          input.append(node("option", { selected: option === value }, String(option)));
        }
      } else if (prop.type === "boolean") {
        input = node("input", { id, type: "checkbox", role: "switch", disabled: true, checked: value === true });
      } else if (prop.type === "integer" || prop.type === "number") {
        input = node("input", { id, type: "number", readonly: true });
        if (value !== undefined) input.value = String(value);
      } else {
        input = node("input", { id, type: "text", readonly: true });
        if (value !== undefined) input.value = typeof value === "string" ? value : JSON.stringify(value);
      }
      const help = prop.description ? node("small", {}, prop.description) : null;
      form.append(node("div", { class: "field" }, label, input, help));
    }
    return form;
  }

  function argumentsSection(card) {
    const raw = JSON.stringify(card.arguments, null, 2);
    const pre = node("pre", { class: "raw", tabindex: "0" }, raw);
    const form = formView(card.tool_name, card.arguments);
    form.hidden = true;
    const rawButton = node("button", { type: "button", "aria-pressed": "true" }, words.raw_json);
    const formButton = node("button", { type: "button", "aria-pressed": "false" }, words.form_view);
    function show(asForm) {
      form.hidden = !asForm;
      pre.hidden = asForm;
      rawButton.setAttribute("aria-pressed", String(!asForm));
      formButton.setAttribute("aria-pressed", String(asForm));
    }
    rawButton.addEventListener("click", () => show(false));
    formButton.addEventListener("click", () => show(true));
    const toggles = node("div", { class: "toggles", role: "group", "aria-label": words.arguments }, rawButton, formButton,
      copyButton(words.copy_args, () => raw));
    return node("details", { class: "args" }, node("summary", {}, words.arguments), toggles, pre, form);
  }

  function textBlock(text) {
    const lines = text.split("\n").length;
    const pre = node("pre", { class: "text", tabindex: "0" }, text);
    const wrap = node("div", { class: "block text-block" }, pre);
    if (text.length > MAX_CHARS || lines > MAX_LINES) {
      pre.classList.add("clipped"); // the whole text stays in the DOM, clipped by CSS
      const more = node("button", { type: "button", class: "more", "aria-expanded": "false" }, words.show_more);
      more.addEventListener("click", () => {
        const open = pre.classList.toggle("clipped") === false;
        more.setAttribute("aria-expanded", String(open));
        more.textContent = open ? words.show_less : words.show_more;
      });
      wrap.append(more);
    }
    wrap.append(copyButton(words.copy_result, () => text));
    return wrap;
  }

  function isImage(mime, data) {
    return typeof mime === "string" && /^image\/(png|jpeg|gif|webp)$/.test(mime) &&
      typeof data === "string" && /^[A-Za-z0-9+/=\s]*$/.test(data);
  }

  function linkFor(uri) {
    if (typeof uri === "string" && uri.startsWith(ARTIFACT_PREFIX)) {
      const rest = uri.slice(ARTIFACT_PREFIX.length).split("/");
      if (rest.length === 2 && rest[0] && rest[1]) {
        return "/runs/" + encodeURIComponent(rest[0]) + "/files/" + encodeURIComponent(rest[1]);
      }
    }
    return null; // any other scheme is shown, never followed
  }

  function contentBlock(block) {
    if (block.type === "text") return textBlock(String(block.text || ""));
    if (block.type === "image") {
      if (!isImage(block.mimeType, block.data)) return textBlock("[image: " + String(block.mimeType) + "]");
      const img = node("img", { alt: block.alt || "image", class: "thumb" });
      img.src = "data:" + block.mimeType + ";base64," + block.data;
      // A thumbnail; a button shows it at full size and back.
      const full = node("button", { type: "button", class: "thumb-button", "aria-pressed": "false", "aria-label": words.full_size }, img);
      full.addEventListener("click", () => {
        const on = img.classList.toggle("full");
        full.setAttribute("aria-pressed", String(on));
      });
      return node("div", { class: "block image-block" }, full);
    }
    if (block.type === "resource_link") {
      const href = linkFor(block.uri);
      const label = String(block.name || block.uri);
      const chip = href ? node("a", { class: "chip link", href }, "↗ " + label) : node("span", { class: "chip" }, "↗ " + label);
      return node("div", { class: "block link-block" }, chip, block.description ? node("small", {}, " " + block.description) : null,
        node("code", { class: "uri" }, String(block.uri)));
    }
    if (block.type === "resource") {
      const resource = block.resource || {};
      const heading = node("p", { class: "embedded" }, "▤ ", node("code", {}, String(resource.uri || "")), " ", String(resource.mimeType || ""));
      const body = typeof resource.text === "string" ? textBlock(resource.text)
        : isImage(resource.mimeType, resource.blob) ? (() => { const i = node("img", { alt: String(resource.uri || ""), class: "thumb" }); i.src = "data:" + resource.mimeType + ";base64," + resource.blob; return i; })()
          : textBlock("[" + String(resource.mimeType || "binary") + "]");
      return node("div", { class: "block resource-block" }, heading, body);
    }
    return textBlock(JSON.stringify(block));
  }

  function resultSection(card) {
    const parts = [];
    if (card.code !== null && card.code !== undefined) {
      parts.push(node("p", { class: "refusal", role: "note" },
        words.refused.replace("{code}", card.code).replace("{reason}", card.reason || "?"), ": ", card.message || ""));
      parts.push(node("p", { class: "note" }, words.retry_note));
    }
    for (const [i, block] of (card.result || []).entries()) {
      if (i > 0) parts.push(node("hr", {}));
      parts.push(contentBlock(block));
    }
    if (!parts.length) return null;
    return node("details", { class: "result", open: card.status === "done" }, node("summary", {}, words.result), ...parts);
  }

  // The run's connections through the egress proxy (docs/console.md, "Connections"): each as it closed, host and
  // port, method, decision and why, bytes each way; they come while the run is on (decision 98). A connection
  // still open is marked so, with its bytes so far (decision 102).
  function connectionsSection(card) {
    const list = card.connections || [];
    if (!list.length) return null;
    const total = Number(card.connections_total) || list.length;
    const parts = [];
    if (total > list.length) {
      parts.push(node("p", { class: "note" },
        words.connections_newest.replace("{shown}", list.length).replace("{count}", total)));
    }
    const items = list.map((c) => {
      const where = c.host === null || c.host === undefined ? "-" : c.host + (c.port ? ":" + c.port : "");
      const decided = c.decision === "allowed" ? words.connection_allowed : words.connection_refused;
      const many = c.count > 1 ? " · " + words.connection_many.replace("{count}", c.count) : "";
      const bytes = " · \u2191 " + Number(c.bytes_up || 0).toLocaleString() + " B \u2193 " +
        Number(c.bytes_down || 0).toLocaleString() + " B";
      if (c.open === true) {
        return node("li", { class: "connection open" },
          node("code", {}, where), " " + (c.method || "") + " · ", node("strong", {}, words.connection_open), bytes);
      }
      return node("li", { class: "connection " + (c.decision === "allowed" ? "allowed" : "refused") },
        node("code", {}, where), " " + (c.method || "") + " · ",
        node("strong", {}, decided + (c.reason ? " (" + c.reason + ")" : "")),
        " · \u2191 " + Number(c.bytes_up || 0).toLocaleString() + " B \u2193 " + Number(c.bytes_down || 0).toLocaleString() +
        " B · " + words.connection_closed + " · " + Number(c.duration_ms || 0) + " ms" + many);
    });
    parts.push(node("ul", { class: "connections" }, ...items));
    if (card.status === "running") parts.push(node("p", { class: "note" }, words.connections_live));
    return node("details", { class: "connections", open: card.status === "running" },
      node("summary", {}, words.connections.replace("{count}", total)), ...parts);
  }

  function cardElement(card) {
    const badge = node("span", { class: "badge", role: "status", "aria-live": "polite", "aria-atomic": "true" },
      node("span", { class: "dot", "aria-hidden": "true" }), node("span", { class: "label" }, ""));
    const when = new Date(card.created_at * 1000).toISOString().replace("T", " ").slice(0, 19);
    const header = node("header", {},
      // Drawn by the stylesheet from the console's own /static/tool.svg: no emoji font needed, nothing from elsewhere.
      node("span", { class: "icon", "aria-hidden": "true" }),
      node("h2", {}, node("a", { href: "/calls/" + encodeURIComponent(card.run_id) }, card.tool_name)),
      badge,
      // The outcome at a glance, collapsed or not: the refusal's code and reason (filled by showCard).
      node("span", { class: "outcome", hidden: true }),
      node("p", { class: "origin" }, words.tool_from + " ", node("span", { class: "chip" }, card.server_id),
        " · " + card.user + " · " + (card.workspace || "-") + " · " + when + " UTC"));
    const article = node("article", { class: "card", role: "region", "aria-label": "Tool invocation: " + card.tool_name, "data-run": card.run_id },
      header, argumentsSection(card));
    // The header opens and closes the arguments (a click on its link or chip excepted).
    header.addEventListener("click", (event) => {
      if (event.target.closest("a, button")) return;
      const args = article.querySelector("details.args");
      args.open = !args.open;
    });
    return article;
  }

  function showCard(card, live) {
    let entry = shown.get(card.run_id);
    if (!entry) {
      const element = cardElement(card);
      entry = { element, status: null, queue: [], timer: null };
      shown.set(card.run_id, entry);
      cardsRoot.prepend(element);
      document.getElementById("empty").hidden = true;
      setBadge(entry, live && card.status === "done" ? "running" : card.status);
      if (live && card.status === "done") advance(entry, "done");
    } else {
      advance(entry, card.status);
    }
    const outcome = entry.element.querySelector(".outcome");
    if (card.code !== null && card.code !== undefined) {
      outcome.textContent = words.outcome_code.replace("{code}", card.code).replace("{reason}", card.reason || "?");
      outcome.hidden = false;
    }
    const oldLinks = entry.element.querySelector("details.connections");
    const links = connectionsSection(card);
    if (oldLinks && links) { links.open = oldLinks.open; oldLinks.replaceWith(links); }
    else if (links) entry.element.querySelector("details.args").after(links);
    const old = entry.element.querySelector("details.result");
    const fresh = resultSection(card);
    if (old && fresh) { fresh.open = old.open || card.status === "done"; old.replaceWith(fresh); }
    else if (old) old.remove();
    else if (fresh) entry.element.append(fresh);
  }

  // The list's paging links (docs/console.md): older from the page's last card, and back to the newest.
  function showPaging(query, older) {
    const paging = document.getElementById("paging");
    if (!paging) return;
    const params = new URLSearchParams(query);
    if (params.has("before")) {
      params.delete("before");
      const rest = params.toString();
      paging.append(node("a", { href: "/calls" + (rest ? "?" + rest : ""), rel: "first" }, words.newest), " ");
    }
    if (older !== null && older !== undefined) {
      const next = new URLSearchParams(query);
      next.set("before", String(older));
      paging.append(node("a", { href: "/calls?" + next.toString(), rel: "next" }, words.older_calls));
    }
  }

  async function startCards() {
    const single = cardsRoot.dataset.run;
    // Checked by the console before the page was served: the filters and paging of the page's own URL.
    const query = cardsRoot.dataset.query || "";
    const filters = cardsRoot.dataset.filters || "";
    schemas = await (await fetch("/api/tools")).json();
    const url = single ? "/api/calls/" + encodeURIComponent(single) : "/api/calls" + (query ? "?" + query : "");
    const answer = await (await fetch(url)).json();
    const cards = single ? [answer.card] : answer.cards;
    // The head was read before the cards: the stream sends what changed after it, and nothing older.
    let cursor = Number(answer.head) || 0;
    for (const card of cards) {
      showCard(card, false);
      cursor = Math.max(cursor, card.last_event_id);
    }
    document.getElementById("empty").hidden = cards.length > 0;
    cardsRoot.setAttribute("aria-busy", "false");
    if (!single) showPaging(query, answer.older);
    if (new URLSearchParams(query).has("before")) { document.body.dataset.ready = "1"; return; } // an older page: not live
    const stream = new EventSource("/api/stream?after=" + cursor + (single ? "&run=" + encodeURIComponent(single) : "") +
      (filters ? "&" + filters : ""));
    stream.addEventListener("card", (event) => showCard(JSON.parse(event.data), true));
    // Too far behind to catch up by the stream (the console replays a bounded number of cards): read the page again.
    stream.addEventListener("reload", () => { stream.close(); window.location.reload(); });
    document.body.dataset.ready = "1";
  }

  // --- approvals (docs/console.md): countdown, Esc = Deny once, default focus, follow new questions ----

  function startApprovals(root) {
    const started = Date.now();
    const countdowns = document.querySelectorAll(".countdown");
    function tick() {
      for (const p of countdowns) {
        const left = Math.max(0, Math.floor(Number(p.dataset.expires) - Number(p.dataset.now) - (Date.now() - started) / 1000));
        p.textContent = left > 0 ? words.time_left.replace("{seconds}", left) : words.expired;
      }
    }
    setInterval(tick, 1000);
    const first = root.querySelector("button[data-default]");
    if (first) first.focus();
    // Loading: once a choice is sent, the block says so and a second choice is not sent.
    for (const form of root.querySelectorAll("form.choices")) {
      form.addEventListener("submit", (event) => {
        if (form.dataset.sending) { event.preventDefault(); return; }
        form.dataset.sending = "1";
        form.setAttribute("aria-busy", "true");
        for (const button of form.querySelectorAll("button")) button.setAttribute("aria-disabled", "true");
        form.append(node("span", { class: "note", role: "status" }, words.sending));
      });
    }
    for (const block of root.querySelectorAll("article.question")) {
      block.addEventListener("keydown", (event) => {
        if (event.key !== "Escape") return;
        const deny = block.querySelector('button[value="DENY_ONCE"]');
        if (deny) { event.preventDefault(); deny.click(); }
      });
    }
    setInterval(async () => {
      try {
        const answer = await (await fetch("/api/questions")).json();
        if (answer.ids.join(",") !== root.dataset.ids) window.location.replace("/approvals");
      } catch (e) { /* the next poll retries */ }
    }, 1500);
    document.body.dataset.ready = "1";
  }

  if (cardsRoot) startCards();
  const questions = document.getElementById("questions");
  if (questions) startApprovals(questions);
  if (!cardsRoot && !questions) document.body.dataset.ready = "1";
})();
