// The epochs console's only script: post an action (commit, abort, recover), show its answer.
// The page itself is rendered by the server; after an action that changed something it is reloaded,
// and the answer is shown again at the top.
(function () {
  "use strict";
  const base = document.body.dataset.base || "/onceflow";
  const pipeline = document.body.dataset.pipeline;
  const banner = document.getElementById("action-result");
  const KEY = "onceflow-console-result";

  function show(outcome, text) {
    if (!banner) return;
    banner.hidden = false;
    banner.className = "action-result " + outcome;
    banner.textContent = text;
  }

  const kept = sessionStorage.getItem(KEY);
  if (kept) {
    sessionStorage.removeItem(KEY);
    const { outcome, text } = JSON.parse(kept);
    show(outcome, text);
  }

  async function act(action, epoch, force) {
    const what = action === "recover" ? "recover " + pipeline : action + " epoch " + epoch + " of " + pipeline;
    if (!window.confirm(what + "?")) return;
    let outcome = "error";
    let text;
    try {
      const response = await fetch(
        base + "/api/pipelines/" + encodeURIComponent(pipeline) + "/actions/" + encodeURIComponent(action),
        {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ epoch: epoch === "" ? null : Number(epoch), force: Boolean(force) }),
        },
      );
      const answer = await response.json();
      if (answer.outcome) {
        outcome = answer.outcome;
        text = [answer.line, ...(answer.log || []).filter((l) => l !== answer.line)].join("\n");
      } else {
        text = response.status + ": " + (typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail));
      }
    } catch (err) {
      text = "the request failed: " + err;
    }
    if (outcome === "done") {
      sessionStorage.setItem(KEY, JSON.stringify({ outcome, text }));
      window.location.reload();
      return;
    }
    show(outcome, text);
  }

  const form = document.getElementById("action-form");
  if (form) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const data = new FormData(form);
      act(String(data.get("action")), String(data.get("epoch") || "").trim(), data.get("force") === "on");
    });
  }
  document.querySelectorAll("button.act").forEach((button) => {
    button.addEventListener("click", () => act(button.dataset.action, button.dataset.epoch, false));
  });
})();
