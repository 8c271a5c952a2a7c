// Small behaviours of the UI pages that htmx does not cover: copying a shown secret.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const text = document.getElementById(button.dataset.copy).textContent.trim();
  navigator.clipboard.writeText(text).then(() => { button.textContent = "Copied"; });
});
