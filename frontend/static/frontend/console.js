// Small progressive enhancements; every page works without them.
document.documentElement.classList.add("js");

// Forms marked data-confirm ask before they submit (revoke, remove).
document.addEventListener("submit", (event) => {
  const message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
    event.stopImmediatePropagation();
  }
}, true);

// The tenant switcher submits as soon as a tenant is picked.
document.addEventListener("change", (event) => {
  const form = event.target.closest("form[data-autosubmit]");
  if (form) form.requestSubmit();
});

// Copy buttons: data-copy names the element whose text is copied.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  const text = source ? source.textContent.trim() : "";
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard API (plain HTTP): select the text so Ctrl+C copies it.
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    button.textContent = "Press Ctrl+C";
    return;
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 2000);
});

// The user menu closes on a click elsewhere, like any menu.
document.addEventListener("click", (event) => {
  document.querySelectorAll("details.user-menu[open]").forEach((menu) => {
    if (!menu.contains(event.target)) menu.removeAttribute("open");
  });
});

// Log views (pre[data-follow]) stay at the bottom as new lines arrive, unless the reader has
// scrolled up; a poll that replaces the log keeps the reader's place.
const logScroll = new Map();
const atBottom = (el) => el.scrollHeight - el.scrollTop - el.clientHeight < 8;
const followLogs = () => {
  document.querySelectorAll("pre[data-follow]").forEach((log) => {
    const kept = logScroll.get(log.id);
    log.scrollTop = kept && !kept.bottom ? kept.top : log.scrollHeight;
  });
  logScroll.clear();
};
document.addEventListener("htmx:beforeSwap", (event) => {
  const target = event.detail.target;
  // Only a poll keeps the place; picking another attempt or replica starts at the bottom.
  if (!target || event.detail.requestConfig?.elt !== target) return;
  target.querySelectorAll("pre[data-follow]").forEach((log) => {
    logScroll.set(log.id, { bottom: atBottom(log), top: log.scrollTop });
  });
});
document.addEventListener("htmx:afterSettle", followLogs);
followLogs();
