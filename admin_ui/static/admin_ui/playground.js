// The playground: streams a chat completion from /v1/chat/completions and shows each delta as it arrives, with the
// reasoning and tool calls apart from the answer. Model text only ever goes in through textContent.
(() => {
  const $ = (id) => document.getElementById(id);
  const messages = [];
  let controller = null;

  $("pg-token").value = sessionStorage.getItem("pg-token") || "";
  $("pg-token").addEventListener("change", () => sessionStorage.setItem("pg-token", $("pg-token").value));

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function userTurn(text) {
    const turn = element("div", "pg-turn user");
    turn.append(element("div", "pg-role", "user"), element("div", "pg-content", text));
    $("pg-transcript").append(turn);
  }

  function assistantTurn() {
    const turn = element("div", "pg-turn assistant");
    const reasoning = element("details", "pg-reasoning");
    reasoning.hidden = true;
    reasoning.append(element("summary", "", "reasoning"), element("div", "pg-reasoning-text"));
    const parts = {
      reasoning, reasoningText: reasoning.lastChild, content: element("div", "pg-content"),
      toolCalls: element("div", "pg-tool-calls"), finish: element("div", "pg-finish"), error: element("div", "pg-error"),
    };
    turn.append(element("div", "pg-role", "assistant"), reasoning, parts.content, parts.toolCalls, parts.finish,
                parts.error);
    $("pg-transcript").append(turn);
    return parts;
  }

  function request() {
    const body = {
      model: $("pg-model").value, messages: [...messages], stream: true, stream_options: { include_usage: true },
      temperature: Number($("pg-temperature").value), max_tokens: Number($("pg-max-tokens").value),
    };
    const system = $("pg-system").value.trim();
    if (system) body.messages.unshift({ role: "system", content: system });
    if ($("pg-json").checked) body.response_format = { type: "json_object" };
    if ($("pg-tools").checked) body.tools = JSON.parse($("pg-tools-json").value);
    return body;
  }

  function showToolCalls(parts, calls) {
    parts.toolCalls.replaceChildren(...calls.map((call) => {
      const box = element("div", "pg-tool-call");
      let args = call.function.arguments;
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (error) { /* still arriving */ }
      box.append(element("strong", "", `${call.function.name}(…)`), element("pre", "", args));
      return box;
    }));
  }

  function apply(parts, chunk, answer) {
    if (chunk.error) throw new Error(chunk.error.message || chunk.error.type);
    if (chunk.usage) {
      const u = chunk.usage;
      answer.usage = `${u.prompt_tokens} prompt + ${u.completion_tokens} completion tokens`;
    }
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      if (delta.reasoning_content) {
        parts.reasoning.hidden = false;
        parts.reasoningText.textContent += delta.reasoning_content;
      }
      if (delta.content) {
        answer.content += delta.content;
        parts.content.textContent = answer.content;
      }
      for (const call of delta.tool_calls || []) {
        const known = answer.toolCalls[call.index] ||= { id: call.id, type: "function", function: { name: "", arguments: "" } };
        if (call.function?.name) known.function.name += call.function.name;
        if (call.function?.arguments) known.function.arguments += call.function.arguments;
        showToolCalls(parts, answer.toolCalls);
      }
      if (choice.finish_reason) answer.finish = choice.finish_reason;
    }
    parts.finish.textContent = [answer.finish && `finish: ${answer.finish}`, answer.usage].filter(Boolean).join(" · ");
  }

  async function send() {
    const text = $("pg-message").value.trim();
    if (!text || controller) return;
    $("pg-message").value = "";
    messages.push({ role: "user", content: text });
    userTurn(text);
    const parts = assistantTurn();
    const answer = { content: "", toolCalls: [], finish: "", usage: "" };
    controller = new AbortController();
    $("pg-send").disabled = true;
    $("pg-stop").disabled = false;
    try {
      const headers = { "Content-Type": "application/json" };
      if ($("pg-token").value) headers.Authorization = `Bearer ${$("pg-token").value}`;
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers, body: JSON.stringify(request()), signal: controller.signal,
      });
      if (!response.ok) {
        const failure = await response.json().catch(() => ({}));
        throw new Error(failure.error?.message || `HTTP ${response.status}`);
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data: ")) continue;
            const data = line.slice(6);
            if (data !== "[DONE]") apply(parts, JSON.parse(data), answer);
          }
        }
      }
    } catch (error) {
      parts.error.textContent = error.name === "AbortError" ? "stopped" : error.message;
    } finally {
      const reply = { role: "assistant", content: answer.content };
      if (answer.toolCalls.length) reply.tool_calls = answer.toolCalls.filter(Boolean);
      messages.push(reply);
      controller = null;
      $("pg-send").disabled = false;
      $("pg-stop").disabled = true;
    }
  }

  $("pg-compose").addEventListener("submit", send);
  $("pg-stop").addEventListener("click", () => controller && controller.abort());
  $("pg-clear").addEventListener("click", () => { messages.length = 0; $("pg-transcript").replaceChildren(); });
  $("pg-message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });
})();
