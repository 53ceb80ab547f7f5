// imagegen page: an image's content credentials. "Verify" asks the server to read the stored
// file's C2PA manifest and check it (GET /api/v1/images/<id>/credentials), then says who signed
// it, what it asserts and whether it verifies. All text through textContent.
(function () {
  "use strict";
  const { api, el } = window.imagegen;

  const VERDICT = {
    Trusted: "✓ Verified: content credentials intact, signed by a trusted certificate",
    Valid: "Signature intact, but the signer is not among the trusted roots",
    Invalid: "✗ Does not verify: the file was changed after it was signed, or the signature is broken",
    none: "✗ No content credentials in this file",
  };
  const SOURCE_TYPES = { trainedAlgorithmicMedia: "made by a trained model (trainedAlgorithmicMedia)" };
  // The manifest's parameter names (jobs/media/credentials.py) in words; width and height are one "Size".
  const LABELS = {
    prompt: "Prompt", negativePrompt: "Negative prompt", originalPrompt: "Your prompt (before the rewrite)",
    rewriter: "Rewriter", seed: "Seed", steps: "Steps", guidanceScale: "Guidance scale", modelVersion: "Model version",
    jobId: "Job", levers: "Levers",
  };

  function words(key) {
    if (LABELS[key]) return LABELS[key];
    const spaced = String(key).replace(/_/g, " ").replace(/([a-z0-9])([A-Z])/g, "$1 $2").toLowerCase();
    return spaced.charAt(0).toUpperCase() + spaced.slice(1);
  }

  function sourceType(uri) {
    const name = String(uri || "").split("/").pop();
    return SOURCE_TYPES[name] || name;
  }

  // `compact` (a gallery tile): the request's parameters folded away under a summary line.
  function show(panel, data, compact) {
    panel.replaceChildren();
    panel.dataset.state = data.state;
    panel.appendChild(el("p", { class: "verdict" }, VERDICT[data.state] || data.state));
    const list = el("dl");
    const rowIn = (into, term, value) => { into.appendChild(el("dt", {}, term)); into.appendChild(el("dd", {}, value)); };
    const row = (term, value) => rowIn(list, term, value);
    const signer = data.signer || {};
    if (signer.common_name || signer.issuer) {
      row("Signed by", [signer.common_name, signer.issuer && signer.issuer !== signer.common_name ? `issued by ${signer.issuer}` : ""]
        .filter(Boolean).join(", ") + (signer.alg ? ` (${signer.alg})` : ""));
    }
    if (signer.time) row("Signed at", signer.time);
    for (const action of data.actions || []) {
      const agent = action.softwareAgent && (action.softwareAgent.name || action.softwareAgent);
      row("Asserted", [action.action, sourceType(action.digitalSourceType), agent ? `by ${agent}` : ""].filter(Boolean).join(" · "));
    }
    for (const failure of data.failures || []) row("Failure", `${failure.code}${failure.explanation ? ": " + failure.explanation : ""}`);
    panel.appendChild(list);
    const params = { ...(data.parameters || {}) };
    if (params.width && params.height) { params.size = `${params.width}×${params.height}`; delete params.width; delete params.height; }
    const shown = Object.entries(params).filter(([, value]) => value !== null && value !== "");
    if (!shown.length) return;
    const paramList = compact ? el("dl") : list;
    for (const [key, value] of shown) rowIn(paramList, words(key), typeof value === "object" ? JSON.stringify(value) : String(value));
    if (compact) {
      const details = el("details", { class: "parameters" });
      details.appendChild(el("summary", {}, `The request, as signed (${shown.length})`));
      details.appendChild(paramList);
      panel.appendChild(details);
    }
  }

  // A "Verify" link for `image` and the panel its answer goes to: [link, panel]. `compact`: for
  // a gallery tile (the request's parameters folded).
  function link(image, compact) {
    const href = `/api/v1/images/${encodeURIComponent(image.id)}/credentials`;
    const anchor = el("a", { href, class: "verify", "data-image": image.id }, "Verify");
    const panel = el("div", { class: "credentials", role: "status", "aria-live": "polite" });
    panel.hidden = true;
    anchor.addEventListener("click", async (event) => {
      event.preventDefault();
      panel.hidden = false;
      panel.dataset.state = "checking";
      panel.textContent = "Checking the content credentials…";
      try {
        const { response, data } = await api("GET", href);
        if (response.ok && data) show(panel, data, Boolean(compact));
        else { panel.dataset.state = "error"; panel.textContent = (data && data.detail) || `Could not check (${response.status}).`; }
      } catch (e) {
        panel.dataset.state = "error";
        panel.textContent = "Could not reach the service.";
      }
    });
    return [anchor, panel];
  }

  window.imagegen.verify = { link };
})();
