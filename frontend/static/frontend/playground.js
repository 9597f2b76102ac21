// The playground: asks the gateway (/v1/chat/completions, streamed as Server-Sent Events) with
// the console's session, shows the answers as they arrive in one or two panes, and, after two
// answers, sends the member's vote. Our own small script; no library.
(() => {
  const root = document.querySelector("[data-playground]");
  const form = root && root.querySelector("[data-chat-form]");
  if (!form) return;
  const csrf = root.dataset.csrf;
  const sendButton = form.querySelector("[data-send]");
  const voteCard = root.querySelector("[data-vote]");
  const panes = {};
  for (const side of ["left", "right"]) {
    panes[side] = { el: root.querySelector(`[data-pane="${side}"]`), select: form.elements[side],
      history: [] };
  }
  // The two versions and the prompt the vote buttons are about, once both have answered.
  let pending = null;

  const chosen = (side) => {
    const option = panes[side].select.selectedOptions[0];
    if (!option || !option.value) return null;
    return { model: option.value, version: option.dataset.version, label: option.dataset.label };
  };

  const setState = (pane, text) => { pane.el.querySelector("[data-pane-state]").textContent = text; };

  const clear = () => {
    for (const side of ["left", "right"]) {
      const pane = panes[side];
      const choice = chosen(side);
      pane.history = [];
      pane.el.querySelector("[data-transcript]").replaceChildren();
      pane.el.hidden = !choice;
      pane.el.querySelector("[data-pane-title]").textContent =
        choice ? `${choice.model} · ${choice.label}` : "";
      setState(pane, "");
    }
    pending = null;
    if (voteCard) voteCard.hidden = true;
  };

  const bubble = (pane, role, text) => {
    const article = document.createElement("article");
    article.className = "sample";
    article.dataset.role = role;
    const head = document.createElement("header");
    head.className = "sample-head";
    head.textContent = role === "user" ? "You" : "Model";
    const body = document.createElement("pre");
    body.className = "sample-text";
    body.textContent = text;
    article.append(head, body);
    pane.el.querySelector("[data-transcript]").append(article);
    return body;
  };

  // Yields the data of each event of a text/event-stream body as it arrives.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
        if (data) yield data;
      }
    }
  }

  const errorText = async (response) => {
    try {
      const body = await response.json();
      if (body.error && body.error.message) return body.error.message;
    } catch { /* not JSON */ }
    return `The gateway answered ${response.status}.`;
  };

  const ask = async (side, settings) => {
    const pane = panes[side];
    const choice = chosen(side);
    const messages = settings.system ? [{ role: "system", content: settings.system }] : [];
    messages.push(...pane.history, { role: "user", content: settings.prompt });
    bubble(pane, "user", settings.prompt);
    const out = bubble(pane, "assistant", "");
    out.dataset.answer = side;
    out.dataset.streaming = "true";
    setState(pane, "answering…");
    let text = "";
    try {
      const response = await fetch(root.dataset.endpoint, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "text/event-stream",
          "X-CSRFToken": csrf },
        body: JSON.stringify({ model: choice.model, messages, stream: true,
          temperature: settings.temperature, max_tokens: settings.maxTokens }),
      });
      if (!response.ok) throw new Error(await errorText(response));
      for await (const data of events(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "The model failed.");
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          text += delta.content;
          out.textContent = text;
        }
      }
      pane.history.push({ role: "user", content: settings.prompt },
        { role: "assistant", content: text });
      setState(pane, "done");
      return true;
    } catch (error) {
      out.textContent = text;
      const note = document.createElement("p");
      note.className = "field-error";
      note.dataset.error = side;
      note.textContent = error.message;
      out.after(note);
      setState(pane, "failed");
      return false;
    } finally {
      out.dataset.streaming = "false";
    }
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = form.elements.prompt.value.trim();
    if (!prompt) return;
    const settings = {
      prompt,
      system: form.elements.system.value.trim(),
      temperature: Number(form.elements.temperature.value || 0),
      maxTokens: Number(form.elements.max_tokens.value || 256),
    };
    const sides = chosen("right") ? ["left", "right"] : ["left"];
    sendButton.disabled = true;
    pending = null;
    if (voteCard) voteCard.hidden = true;
    form.elements.prompt.value = "";
    // Both models answer at once.
    const answered = await Promise.all(sides.map((side) => ask(side, settings)));
    sendButton.disabled = false;
    const left = chosen("left");
    const right = chosen("right");
    if (voteCard && right && answered.every(Boolean) && left.version !== right.version) {
      pending = { left: left.version, right: right.version, prompt };
      voteCard.hidden = false;
    }
  });

  form.querySelector("[data-clear]").addEventListener("click", clear);
  for (const side of ["left", "right"]) panes[side].select.addEventListener("change", clear);

  if (voteCard) {
    voteCard.addEventListener("click", async (event) => {
      const button = event.target.closest("[data-vote-value]");
      if (!button || !pending) return;
      const body = new FormData();
      body.append("left_version", pending.left);
      body.append("right_version", pending.right);
      body.append("prompt", pending.prompt);
      body.append("vote", button.dataset.voteValue);
      pending = null;
      voteCard.hidden = true;
      const response = await fetch(root.dataset.voteUrl, {
        method: "POST", credentials: "same-origin", body,
        headers: { "X-CSRFToken": csrf, "X-Requested-With": "playground" },
      });
      const html = await response.text();
      const ratings = document.getElementById("arena-ratings");
      if (ratings && html.includes('id="arena-ratings"')) ratings.outerHTML = html;
    });
  }

  clear();
})();
