// imagegen page: the current job. Live over the websocket (held-for-review included: a
// moderator's decision arrives as a status event); the queue position and ETA polled while
// queued; a blocked job's appeal (once) and its outcome.
(function () {
  "use strict";
  const { TERMINAL, $, api, el, safeSrc, show, seconds, downloadName } = window.imagegen;

  const QUEUE_POLL_MS = 2000;
  const APPEAL_POLL_MS = 3000;
  const current = { job: null, socket: null, poll: null, queuePoll: null, appealPoll: null, ticker: null, step: 0, eta: null, decided: null };

  const BLOCKED = {
    prompt: "Blocked by the prompt check",
    rewrite: "Blocked by the prompt check of the rewritten prompt",
    image: "Blocked: an image did not pass the safety check",
    human: "Blocked by a moderator",
  };

  function stopTimers() {
    for (const name of ["poll", "queuePoll", "appealPoll", "ticker"]) {
      if (current[name]) { clearInterval(current[name]); current[name] = null; }
    }
  }

  function stopWatching() {
    if (current.socket) { current.socket.onclose = null; current.socket.close(); current.socket = null; }
    stopTimers();
  }

  // --- rendering ------------------------------------------------------------------------------
  function setProgress(step, total) {
    if (step < current.step) return;
    current.step = step;
    const bar = $("progress");
    bar.max = total || 1;
    bar.value = step;
    bar.setAttribute("aria-valuetext", `step ${step} of ${total}`);
    $("progress-text").textContent = `step ${step} / ${total}`;
  }

  function renderQueue() {
    const job = current.job;
    const box = $("queue-info");
    if (!job || job.status !== "queued") { show(box, false); return; }
    const parts = [];
    if (typeof job.queue_position === "number") {
      parts.push(job.queue_position === 0 ? "Next in line" : `${job.queue_position} job${job.queue_position > 1 ? "s" : ""} ahead of yours`);
    }
    // The countdown in whole seconds (the text rounds to minutes past 90 s).
    box.dataset.etaSeconds = "";
    if (current.eta) {
      const left = current.eta.seconds - (Date.now() - current.eta.at) / 1000;
      parts.push(left > 0.5 ? `ready in about ${seconds(left)}` : "any moment now");
      box.dataset.etaSeconds = String(Math.max(0, Math.round(left)));
    } else if (job.eta_seconds === null && typeof job.queue_position === "number") {
      parts.push("no GPU worker is running right now: it starts when one is");
    }
    box.textContent = parts.length ? parts.join(" · ") : "Checking the prompt…";
    box.dataset.position = typeof job.queue_position === "number" ? String(job.queue_position) : "";
    show(box, true);
  }

  function explainStatus(job) {
    const reasonBox = $("current-reason");
    const next = $("next-step");
    let reason = "";
    let nextText = "";
    if (job.status === "blocked") {
      reason = `${BLOCKED[job.blocked_stage] || "Blocked"}: ${job.reason}`;
      if (!job.appeal) nextText = "If you think this is a mistake, ask a moderator to look at it (you can appeal once).";
      else if (job.appeal.status === "pending") nextText = "Appeal sent: a moderator will decide. This page shows the decision as soon as it is made.";
      else if (job.appeal.status === "upheld") nextText = "A moderator looked at your appeal and kept the block.";
    } else if (job.status === "review") {
      reason = `Held for review: ${job.reason}`;
      nextText = job.blocked_stage === "prompt"
        ? "A moderator will look at the prompt. You can stay or come back later: if it is approved, the image is made and appears here and in your gallery; if not, you will see why and can appeal."
        : "A moderator will look at the image. You can stay or come back later: if it is approved, it appears here and in your gallery; if not, you will see why and can appeal.";
    } else if (job.status === "failed") {
      reason = `Failed: ${job.reason}`;
      nextText = "Nothing was delivered. Reuse the settings to try again.";
    } else if (job.status === "cancelled") {
      reason = job.reason ? `Cancelled: ${job.reason}` : "Cancelled.";
    } else if (job.degraded && job.requested_steps) {
      nextText = `The service was busy: this job runs ${job.steps} steps instead of ${job.requested_steps}.`;
    }
    reasonBox.textContent = reason;
    reasonBox.dataset.status = job.status;
    show(reasonBox, Boolean(reason));
    next.textContent = nextText;
    show(next, Boolean(nextText));
    show($("appeal-box"), job.status === "blocked" && !job.appeal);
    if (job.status === "blocked" && !job.appeal) $("appeal-note").placeholder = appealPlaceholder(job);
    const note = job.status === "blocked" && job.appeal && job.appeal.note ? job.appeal.note : "";
    $("appeal-sent-text").textContent = note;
    show($("appeal-sent"), Boolean(note));
  }

  // What a note might say about this job (its own prompt, not an example about another one).
  function appealPlaceholder(job) {
    const prompt = job.prompt.length > 60 ? `${job.prompt.slice(0, 57)}…` : job.prompt;
    return `Why “${prompt}” is fine: what it shows, what it is for.`;
  }

  // Built once per set of images: a render of the same finished job (a poll's answer, a late
  // event) keeps what is there, an open Verify panel included.
  function showImages(job) {
    const box = $("results");
    const clip = Array.isArray(job.videos) && job.videos.length ? job.videos[0] : null;
    const key = (job.images || []).map((image) => image.id).join(",") + (clip ? `|${clip.url}` : "");
    if (box.dataset.images === key && box.children.length) return;
    box.dataset.images = key;
    window.imagegen.video.release(box);
    box.replaceChildren();
    // A video job: its clip plays here (video.js), its frames are not shown one by one.
    if (clip && window.imagegen.video.show(box, job)) { show($("preview-figure"), false); return; }
    for (const image of job.images || []) {
      const src = safeSrc(image.url);
      if (!src) continue;
      const figure = el("figure", { class: "result" });
      const link = el("a", { href: src, target: "_blank", rel: "noopener" });
      link.appendChild(el("img", {
        src, width: String(image.width), height: String(image.height), class: "final",
        alt: `Generated image ${image.index + 1} (seed ${image.seed}) for: ${job.prompt}`,
      }));
      figure.appendChild(link);
      const caption = el("figcaption", { class: "muted" });
      caption.appendChild(el("span", { class: "seed" }, `seed ${image.seed}`));
      caption.appendChild(document.createTextNode(" · "));
      caption.appendChild(el("a", { href: src, download: downloadName(job, image), class: "download" }, "Download"));
      const [verify, panel] = window.imagegen.verify.link(image);
      caption.appendChild(document.createTextNode(" · "));
      caption.appendChild(verify);
      figure.appendChild(caption);
      figure.appendChild(panel);
      box.appendChild(figure);
    }
    if (box.children.length) show($("preview-figure"), false);
  }

  function render(job, previous) {
    current.job = job;
    const badge = $("current-status");
    badge.textContent = job.status;
    badge.dataset.status = job.status;
    $("current-prompt").textContent = job.prompt;
    // The prompt the model was given, when the service rewrote it (a job's `revised_prompt`).
    const revised = typeof job.revised_prompt === "string" && job.revised_prompt && job.revised_prompt !== job.prompt ? job.revised_prompt : "";
    $("current-revised-text").textContent = revised;
    show($("current-revised"), Boolean(revised));
    // What the rewriter substituted, or could not draw (a job's `rewrite_notes`), under it.
    const notes = Array.isArray(job.rewrite_notes) ? job.rewrite_notes.filter((n) => typeof n === "string") : [];
    let notesLine = $("current-rewrite-notes");
    if (!notesLine) {
      notesLine = el("p", { id: "current-rewrite-notes", class: "revised-notes hint" });
      $("current-revised").after(notesLine);
    }
    notesLine.textContent = notes.join("; ");
    notesLine.dataset.notes = String(notes.length);
    show(notesLine, notes.length > 0);
    const text = $("progress-text");
    if (job.status === "done") setProgress(job.steps, job.steps);
    else if (job.progress && job.status === "running") setProgress(job.progress.step, job.steps);
    if (job.status === "queued") text.textContent = "waiting for a GPU…";
    else if (job.status === "review") text.textContent = "held for review";
    else if (job.status === "done") text.textContent = "done";
    else if (TERMINAL.has(job.status)) text.textContent = job.status;
    if (typeof job.eta_seconds === "number" && job.status === "queued") current.eta = { seconds: job.eta_seconds, at: Date.now() };
    else if (job.status !== "queued") current.eta = null;
    renderQueue();
    explainStatus(job);
    // A moderator's decision, said once and only while it is the job's state: held again (its
    // images, after the prompt was approved) or ended otherwise, the line goes; never two states.
    if (previous === "review" && job.status !== "review") current.decided = job.status === "blocked" ? "rejected" : "approved";
    else if (previous === "blocked" && job.status !== "blocked" && job.status !== "cancelled") current.decided = "overturned";
    else if (job.status === "review") current.decided = null;
    let said = "";
    if (current.decided === "rejected" && job.status === "blocked") said = "A moderator decided: not approved.";
    else if (current.decided === "approved" && job.status === "done") said = "A moderator approved it.";
    else if (current.decided === "approved" && (job.status === "queued" || job.status === "running")) said = "A moderator approved it: it is being made now.";
    else if (current.decided === "overturned" && (job.status === "done" || !TERMINAL.has(job.status))) said = "A moderator overturned the block after your appeal.";
    const decision = $("decision");
    decision.textContent = said;
    decision.dataset.kind = said ? current.decided : "";
    show(decision, Boolean(said));
    $("cancel").hidden = TERMINAL.has(job.status);
    if (job.status === "done") showImages(job);
    else clearImages();
    if (job.status === "running") window.imagegen.gallery.follow(job.id, current.step, job.steps);
  }

  function clearImages() {
    window.imagegen.video.release($("results"));
    $("results").replaceChildren();
    delete $("results").dataset.images;
  }

  // --- live updates ------------------------------------------------------------------------
  // The full job (blocked stage, appeal, images, the estimate) from the API, rendered against
  // the status shown before (`previous`, default: the current one).
  async function refresh(previous) {
    if (!current.job) return null;
    const id = current.job.id;
    const before = previous === undefined ? current.job.status : previous;
    const { response, data } = await api("GET", `/api/v1/jobs/${id}`);
    if (!response.ok || !data || !current.job || current.job.id !== id) return null;
    render(data, before);
    return { data, previous: before };
  }

  async function onStatus(event) {
    const previous = current.job.status;
    if (event.status === previous) return;
    if (event.status === "queued" || event.status === "running") current.step = 0;
    const got = await refresh(previous);
    if (!got) render({ ...current.job, status: event.status, reason: event.reason, images: event.images || [] }, previous);
    window.imagegen.gallery.load();
    afterStatus();
  }

  function afterStatus() {
    const job = current.job;
    if (!job) return;
    if (job.status === "queued" && !current.queuePoll) startQueuePoll();
    if (job.status !== "queued" && current.queuePoll) { clearInterval(current.queuePoll); current.queuePoll = null; }
    if (job.status === "blocked" && job.appeal && job.appeal.status === "pending" && !current.appealPoll) startAppealPoll();
    if (TERMINAL.has(job.status) && current.ticker) { clearInterval(current.ticker); current.ticker = null; }
  }

  function onEvent(event) {
    if (!current.job || event.job !== current.job.id) return;
    if (event.type === "status") onStatus(event);
    else if (event.type === "progress") {
      if (current.job.status !== "running") { current.job.status = "running"; render(current.job); }
      setProgress(event.step, event.total);
      window.imagegen.gallery.follow(event.job, event.step, event.total);
    } else if (event.type === "preview") setPreview(event);
  }

  function setPreview(event) {
    const src = safeSrc(event.image);
    if (!src) return;
    const img = $("preview");
    img.src = src;
    img.dataset.step = String(event.step);
    const total = current.job ? current.job.steps : 0;
    $("preview-caption").textContent = total ? `Preview at step ${event.step} of ${total}` : `Preview at step ${event.step}`;
    show($("preview-figure"), true);
  }

  function startQueuePoll() {
    current.queuePoll = setInterval(async () => {
      const got = await refresh();
      if (got && got.data.status !== got.previous) afterStatus();
    }, QUEUE_POLL_MS);
    if (!current.ticker) current.ticker = setInterval(renderQueue, 1000);
  }

  // A blocked job's appeal: the socket has closed (blocked is terminal), so ask until decided.
  function startAppealPoll() {
    current.appealPoll = setInterval(async () => {
      const got = await refresh();
      if (!got) return;
      const job = got.data;
      if (job.status !== "blocked") {
        clearInterval(current.appealPoll);
        current.appealPoll = null;
        window.imagegen.gallery.load();
        if (!TERMINAL.has(job.status)) openSocket(job);
      } else if (job.appeal && job.appeal.status !== "pending") {
        clearInterval(current.appealPoll);
        current.appealPoll = null;
      }
    }, APPEAL_POLL_MS);
  }

  // When the socket cannot be used (a proxy, a drop), poll the job until it ends.
  function pollJob() {
    if (current.poll || !current.job) return;
    current.poll = setInterval(async () => {
      const got = await refresh();
      if (!got) return;
      if (got.data.status !== got.previous) { window.imagegen.gallery.load(); afterStatus(); }
      if (TERMINAL.has(got.data.status)) { clearInterval(current.poll); current.poll = null; }
    }, 1500);
  }

  function openSocket(job) {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + job.websocket_url);
    current.socket = socket;
    socket.onmessage = (message) => {
      try { onEvent(JSON.parse(message.data)); } catch (e) { /* ignore a malformed frame */ }
    };
    socket.onclose = () => {
      if (current.socket === socket) current.socket = null;
      if (current.job && current.job.id === job.id && !TERMINAL.has(current.job.status)) pollJob();
    };
  }

  function watch(job) {
    stopWatching();
    current.job = job;
    current.step = 0;
    current.decided = null;
    current.eta = null;
    clearImages();
    remember(job);
    $("preview").removeAttribute("src");
    show($("preview-figure"), false);
    show($("decision"), false);
    show($("appeal-error"), false);
    $("appeal-note").value = "";
    show($("current"), true);
    $("cancel").disabled = false;
    $("appeal").disabled = false;
    setProgress(job.progress ? job.progress.step : 0, job.steps);
    render(job);
    afterStatus();
    // Held for review keeps listening: the moderator's decision arrives as a status event.
    if (!TERMINAL.has(job.status)) openSocket(job);
  }

  // --- after a reload ----------------------------------------------------------------------------
  const REMEMBER = "imagegen.currentJob";

  function remember(job) {
    try { localStorage.setItem(REMEMBER, job.id); } catch (e) { /* storage off: the gallery's list still finds it */ }
  }

  // Still worth watching: queued, running, held for review, or blocked with an appeal pending.
  function unfinished(job) {
    return !TERMINAL.has(job.status) || (job.status === "blocked" && Boolean(job.appeal) && job.appeal.status === "pending");
  }

  async function restore(recent) {
    if (current.job) return;
    let job = null;
    let saved = "";
    try { saved = localStorage.getItem(REMEMBER) || ""; } catch (e) { saved = ""; }
    if (saved) {
      const { response, data } = await api("GET", `/api/v1/jobs/${encodeURIComponent(saved)}`);
      if (response.ok && data && unfinished(data)) job = data;
    }
    job = job || (recent || []).find(unfinished) || null;
    if (job && !current.job) watch(job);
  }

  async function cancelCurrent() {
    if (!current.job) return;
    const button = $("cancel");
    button.disabled = true;
    const { response, data } = await api("POST", `/api/v1/jobs/${current.job.id}/cancel`);
    if (data && data.status) render(data, current.job.status);
    if (!response.ok && response.status !== 409) button.disabled = false;
    afterStatus();
    window.imagegen.gallery.load();
  }

  async function appealCurrent() {
    if (!current.job) return;
    const button = $("appeal");
    const error = $("appeal-error");
    button.disabled = true;
    show(error, false);
    const { response, data } = await api("POST", `/api/v1/jobs/${current.job.id}/appeal`, { note: $("appeal-note").value.trim() });
    if (response.status === 202 && data) {
      render(data, data.status);
      afterStatus();
      return;
    }
    error.textContent = (data && (data.detail || [].concat(data.note || []).join(" "))) || `The appeal was not sent (${response.status}).`;
    show(error, true);
    button.disabled = response.status === 409;
    if (response.status === 409) refresh();
  }

  function init() {
    $("cancel").addEventListener("click", cancelCurrent);
    $("appeal").addEventListener("click", appealCurrent);
    $("reuse-current").addEventListener("click", () => { if (current.job) window.imagegen.form.reuse(current.job); });
  }

  window.imagegen.current = { init, watch, restore, get job() { return current.job; } };
})();
