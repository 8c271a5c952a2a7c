// The playground: streams a chat completion from /v1/chat/completions and shows each delta as it arrives, with the
// reasoning and tool calls apart from the answer. It calls the public API exactly as a client would, so what it shows
// is what a client gets. Model text only ever goes in through textContent.
(() => {
  const $ = (id) => document.getElementById(id);
  let messages = []; // the conversation sent with each request, the system prompt aside (it is read at each send)
  let pendingCalls = []; // the last answer's tool calls that no tool message has answered yet
  let controller = null;

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function headers() {
    const token = $("pg-token").value.trim();
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  function errorText(error) {
    return [error.type, error.message].filter(Boolean).join(": ") || JSON.stringify(error);
  }

  // The select starts with the names the server rendered; /v1/models brings it up to date (a model loaded since).
  async function refreshModels() {
    const select = $("pg-model");
    try {
      const response = await fetch("/v1/models", { headers: headers() });
      const body = await response.json();
      if (!response.ok) throw new Error(errorText(body.error || {}));
      const chosen = select.value;
      const names = body.data.map((row) => row.id);
      select.replaceChildren(...names.map((name) => element("option", "", name)));
      if (!names.length) select.append(element("option", "", "no model is served"));
      if (names.includes(chosen)) select.value = chosen;
      $("pg-models-hint").textContent = "";
    } catch (error) {
      $("pg-models-hint").textContent = `Could not list the models (${error.message}).`;
    }
  }

  function userTurn(role, text) {
    const turn = element("div", `pg-turn ${role === "tool" ? "tool" : "user"}`);
    turn.append(element("div", "pg-role", role), element("div", "pg-content", text));
    $("pg-transcript").append(turn);
  }

  function assistantTurn() {
    const turn = element("div", "pg-turn assistant");
    const reasoning = element("details", "pg-reasoning");
    reasoning.hidden = true;
    reasoning.append(element("summary", "", "reasoning"), element("div", "pg-reasoning-text"));
    const parts = {
      reasoning,
      reasoningText: reasoning.lastChild,
      content: element("div", "pg-content"),
      toolCalls: element("div", "pg-tool-calls"),
      finish: element("div", "pg-finish"),
      error: element("div", "pg-error"),
    };
    turn.append(element("div", "pg-role", "assistant"), reasoning, parts.content, parts.toolCalls, parts.finish,
                parts.error);
    $("pg-transcript").append(turn);
    turn.scrollIntoView({ block: "end" });
    return parts;
  }

  function requestBody() {
    const body = {
      model: $("pg-model").value, messages: [...messages], stream: true, stream_options: { include_usage: true },
      temperature: Number($("pg-temperature").value), max_tokens: Number($("pg-max-tokens").value),
    };
    const system = $("pg-system").value.trim();
    if (system) body.messages.unshift({ role: "system", content: system });
    if ($("pg-json").checked) body.response_format = { type: "json_object" };
    if ($("pg-tools").checked) {
      try {
        body.tools = JSON.parse($("pg-tools-json").value);
      } catch (error) {
        throw new Error(`The tools are not valid JSON: ${error.message}`);
      }
    }
    return body;
  }

  function showToolCalls(parts, calls) {
    parts.toolCalls.replaceChildren(...calls.filter(Boolean).map((call) => {
      const box = element("div", "pg-tool-call");
      let args = call.function.arguments;
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* still arriving, or not JSON: shown as is */ }
      box.append(element("div", "pg-tool-name", call.function.name), element("pre", "pg-tool-args", args));
      return box;
    }));
  }

  function showFinish(parts, answer) {
    parts.finish.textContent = [
      answer.finish && `finish: ${answer.finish}`,
      answer.usage && `${answer.usage.prompt_tokens} prompt + ${answer.usage.completion_tokens} completion tokens`,
      answer.formatStatus && `response_format: ${answer.formatStatus}`,
    ].filter(Boolean).join(" · ");
  }

  // One parsed SSE event: deltas are appended to the DOM at once, so the answer visibly grows chunk by chunk.
  function apply(parts, chunk, answer) {
    if (chunk.error) throw new Error(errorText(chunk.error));
    if (chunk.usage) answer.usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      if (delta.reasoning_content) {
        if (parts.reasoning.hidden) parts.reasoning.open = true; // open while it streams; the operator may fold it
        parts.reasoning.hidden = false;
        parts.reasoningText.textContent += delta.reasoning_content;
      }
      if (delta.content) {
        answer.content += delta.content;
        parts.content.textContent = answer.content;
      }
      for (const call of delta.tool_calls || []) {
        answer.toolCalls[call.index] ||= { id: call.id, type: "function", function: { name: "", arguments: "" } };
        const known = answer.toolCalls[call.index];
        if (call.function?.name) known.function.name += call.function.name;
        if (call.function?.arguments) known.function.arguments += call.function.arguments;
        showToolCalls(parts, answer.toolCalls);
      }
      if (choice.finish_reason) answer.finish = choice.finish_reason;
      if (choice.tool_call_error) {
        const problem = choice.tool_call_error;
        parts.error.textContent = `tool_call_error ${problem.code}: ${problem.message}`;
      }
    }
    if (chunk.response_format_status) answer.formatStatus = chunk.response_format_status;
    showFinish(parts, answer);
  }

  async function readStream(response, parts, answer) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replaceAll("\r\n", "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data !== "[DONE]") apply(parts, JSON.parse(data), answer);
        }
      }
    }
  }

  // A message answers the oldest pending tool call when there is one (as a tool turn), else it is a user turn.
  function nextTurn(text) {
    const call = pendingCalls[0];
    if (!call) return { role: "user", content: text };
    return { role: "tool", tool_call_id: call.id, name: call.function.name, content: text };
  }

  function showComposeHint() {
    const call = pendingCalls[0];
    $("pg-message").placeholder = call
      ? `The result of ${call.function.name} (sent as a tool message); New chat starts over`
      : "Say something (Enter sends, Shift+Enter is a new line)";
  }

  function keepTurn(answer, kept, text) {
    if (answer.opened) {
      // The model's turn stays in the conversation as far as it came, even when it was stopped or cut by an error.
      const calls = answer.toolCalls.filter(Boolean);
      const reply = { role: "assistant", content: answer.content };
      if (calls.length) reply.tool_calls = calls;
      messages.push(reply);
      pendingCalls = [...calls];
    } else {
      // Refused before it began: the turn is taken back (its text returns to the box), so a retry does not repeat it.
      messages.length = kept.length;
      pendingCalls = kept.pendingCalls;
      $("pg-message").value = text;
    }
  }

  async function send() {
    const text = $("pg-message").value.trim();
    if (!text || controller) return;
    const history = messages; // New chat replaces it
    const kept = { length: history.length, pendingCalls: [...pendingCalls] };
    const turn = nextTurn(text);
    messages.push(turn);
    if (turn.role === "tool") pendingCalls.shift();
    $("pg-message").value = "";
    userTurn(turn.role, text);
    if (pendingCalls.length) {
      // The model may only go on once every call of its turn has its result.
      showComposeHint();
      return;
    }
    const parts = assistantTurn();
    const answer = { opened: false, content: "", toolCalls: [], finish: "", usage: null, formatStatus: "" };
    controller = new AbortController();
    $("pg-send").disabled = true;
    $("pg-stop").disabled = false;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json", ...headers() },
        body: JSON.stringify(requestBody()), signal: controller.signal,
      });
      if (!response.ok) {
        const failure = await response.json().catch(() => ({}));
        throw new Error(failure.error ? errorText(failure.error) : `HTTP ${response.status}`);
      }
      answer.opened = true;
      await readStream(response, parts, answer);
    } catch (error) {
      parts.error.textContent = error.name === "AbortError" ? "stopped" : error.message;
    } finally {
      // Unless New chat started over while this answer streamed, the conversation takes in how the turn went.
      if (history === messages) keepTurn(answer, kept, text);
      showComposeHint();
      controller = null;
      $("pg-send").disabled = false;
      $("pg-stop").disabled = true;
    }
  }

  $("pg-token").value = sessionStorage.getItem("pg-token") || "";
  $("pg-token").addEventListener("change", () => {
    sessionStorage.setItem("pg-token", $("pg-token").value.trim());
    refreshModels();
  });
  $("pg-compose").addEventListener("submit", (event) => { event.preventDefault(); send(); });
  $("pg-stop").addEventListener("click", () => controller?.abort());
  $("pg-clear").addEventListener("click", () => {
    controller?.abort();
    messages = [];
    pendingCalls = [];
    showComposeHint();
    $("pg-transcript").replaceChildren();
  });
  $("pg-message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });
  showComposeHint();
  refreshModels();
})();
