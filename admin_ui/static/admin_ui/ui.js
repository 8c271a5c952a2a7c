// Small behaviours of the UI pages that htmx does not cover: copying a shown secret, showing error answers.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const text = document.getElementById(button.dataset.copy).textContent.trim();
  navigator.clipboard.writeText(text).then(() => { button.textContent = "Copied"; });
});

// An action answered with an error page (4xx/5xx, rendered under /ui/ as HTML) is shown like any other answer,
// instead of htmx's default of ignoring it, so a failed action never looks like nothing happened.
document.addEventListener("htmx:beforeSwap", (event) => {
  if (event.detail.xhr.status >= 400) {
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  }
});
