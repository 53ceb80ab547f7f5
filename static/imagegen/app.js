// imagegen: the end users' page. Plain JS, no build. User text only ever goes through
// textContent / attributes, never innerHTML.
(function () {
  "use strict";

  const TERMINAL = new Set(["done", "blocked", "failed", "cancelled"]);
  const $ = (id) => document.getElementById(id);

  function cookie(name) {
    const match = document.cookie.split(";").map((c) => c.trim()).find((c) => c.startsWith(name + "="));
    return match ? decodeURIComponent(match.slice(name.length + 1)) : "";
  }

  async function api(method, url, body) {
    const headers = { Accept: "application/json" };
    if (method !== "GET") headers["X-CSRFToken"] = cookie("csrftoken");
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    return { response, data };
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function safeSrc(url) {
    return typeof url === "string" && (url.startsWith("/") || url.startsWith("data:image/")) ? url : "";
  }

  function show(node, visible) { node.hidden = !visible; }

  // --- the current job ---------------------------------------------------------------------
  const current = { job: null, socket: null, poll: null, step: 0 };

  function setStatus(status, reason) {
    const badge = $("current-status");
    badge.textContent = status;
    badge.dataset.status = status;
    const reasonBox = $("current-reason");
    const explain = { blocked: "Blocked: ", failed: "Failed: ", cancelled: "", review: "Held for review: " };
    if (reason && status in explain) {
      reasonBox.textContent = explain[status] + reason;
      reasonBox.dataset.status = status;
      show(reasonBox, true);
    } else {
      show(reasonBox, false);
    }
    $("cancel").hidden = TERMINAL.has(status);
    const text = $("progress-text");
    if (status === "queued") text.textContent = "waiting for a GPU…";
    else if (status === "done") text.textContent = "done";
    else if (status === "review") text.textContent = "held for review";
    else if (TERMINAL.has(status)) text.textContent = status;
  }

  function setProgress(step, total) {
    if (step < current.step) return;
    current.step = step;
    const bar = $("progress");
    bar.max = total || 1;
    bar.value = step;
    bar.setAttribute("aria-valuetext", `step ${step} of ${total}`);
    $("progress-text").textContent = `step ${step} / ${total}`;
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

  function showImages(images) {
    const box = $("results");
    box.replaceChildren();
    for (const image of images || []) {
      const src = safeSrc(image.url);
      if (!src) continue;
      const link = el("a", { href: src, target: "_blank", rel: "noopener" });
      const img = el("img", {
        src, width: String(image.width), height: String(image.height), class: "final",
        alt: `Generated image ${image.index + 1} (seed ${image.seed}) for: ${current.job ? current.job.prompt : ""}`,
      });
      link.appendChild(img);
      box.appendChild(link);
    }
    if (box.children.length) show($("preview-figure"), false);
  }

  function onEvent(event) {
    if (!current.job || event.job !== current.job.id) return;
    if (event.type === "status") {
      current.job.status = event.status;
      if (event.status === "queued") current.step = 0;
      setStatus(event.status, event.reason);
      if (event.status === "done") {
        setProgress(current.job.steps, current.job.steps);
        showImages(event.images);
      }
      if (TERMINAL.has(event.status) || event.status === "review") {
        stopWatching();
        loadGallery();
      }
    } else if (event.type === "progress") {
      setProgress(event.step, event.total);
    } else if (event.type === "preview") {
      setPreview(event);
    }
  }

  function stopWatching() {
    if (current.socket) { current.socket.onclose = null; current.socket.close(); current.socket = null; }
    if (current.poll) { clearInterval(current.poll); current.poll = null; }
  }

  // When the socket can't be used (a proxy, a drop), poll the job until it ends.
  function pollJob() {
    if (current.poll || !current.job) return;
    const id = current.job.id;
    current.poll = setInterval(async () => {
      const { response, data } = await api("GET", `/api/v1/jobs/${id}`);
      if (!response.ok || !current.job || current.job.id !== id) return;
      if (data.progress) setProgress(data.progress.step, data.progress.total);
      if (data.status !== current.job.status || TERMINAL.has(data.status)) {
        onEvent({ type: "status", job: id, status: data.status, reason: data.reason, images: data.images });
      }
    }, 1000);
  }

  function watch(job) {
    stopWatching();
    current.job = job;
    current.step = 0;
    $("current-prompt").textContent = job.prompt;
    $("results").replaceChildren();
    $("preview").removeAttribute("src");
    show($("preview-figure"), false);
    show($("current"), true);
    $("cancel").disabled = false;
    setProgress(job.progress ? job.progress.step : 0, job.steps);
    setStatus(job.status, job.reason);
    if (job.status === "done") { setProgress(job.steps, job.steps); showImages(job.images); return; }
    if (TERMINAL.has(job.status) || job.status === "review") return;
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

  async function cancelCurrent() {
    if (!current.job) return;
    const button = $("cancel");
    button.disabled = true;
    const { response, data } = await api("POST", `/api/v1/jobs/${current.job.id}/cancel`);
    if (data && data.status) onEvent({ type: "status", job: current.job.id, status: data.status, reason: data.reason || "", images: data.images || [] });
    if (!response.ok && response.status !== 409) button.disabled = false;
  }

  // --- the form ----------------------------------------------------------------------------
  function fieldErrors(data) {
    if (!data || typeof data !== "object") return "Something went wrong. Please try again.";
    if (data.detail) return String(data.detail);
    return Object.entries(data).map(([field, errors]) => `${field}: ${[].concat(errors).join(" ")}`).join("\n");
  }

  async function submit(event) {
    event.preventDefault();
    const form = event.target;
    const formError = $("form-error");
    const promptError = $("prompt-error");
    show(formError, false);
    show(promptError, false);
    const prompt = form.prompt.value.trim();
    if (!prompt) {
      promptError.textContent = "Write a prompt first.";
      show(promptError, true);
      form.prompt.focus();
      return;
    }
    const [width, height] = form.size.value.split("x").map(Number);
    const body = { prompt, width, height, steps: Number(form.steps.value), count: Number(form.count.value) };
    if (form.seed.value !== "") body.seed = Number(form.seed.value);
    const button = $("submit");
    button.disabled = true;
    button.textContent = "Submitting…";
    try {
      const { response, data } = await api("POST", "/api/v1/jobs", body);
      if (response.status === 202) {
        watch(data);
        loadGallery();
      } else if (response.status === 429) {
        const wait = response.headers.get("Retry-After");
        formError.textContent = "The service is busy." + (wait ? ` Try again in ${wait} s.` : " Try again shortly.");
        show(formError, true);
      } else if (response.status === 401 || response.status === 403) {
        formError.textContent = "Your session has ended: reload the page and sign in again.";
        show(formError, true);
      } else {
        formError.textContent = fieldErrors(data);
        show(formError, true);
      }
    } catch (e) {
      formError.textContent = "Could not reach the service. Check your connection and try again.";
      show(formError, true);
    } finally {
      button.disabled = false;
      button.textContent = "Generate";
    }
  }

  // --- the gallery -------------------------------------------------------------------------
  function tile(job) {
    const item = el("li", { class: "tile" });
    const thumb = el("button", { type: "button", class: "thumb", "aria-label": `Show job: ${job.prompt}` });
    const first = (job.images || [])[0];
    if (first && safeSrc(first.url)) {
      thumb.appendChild(el("img", { src: safeSrc(first.url), alt: job.prompt, loading: "lazy", width: String(first.width), height: String(first.height) }));
    } else {
      thumb.textContent = job.status === "running" ? `running ${job.progress.step}/${job.progress.total}` : job.status;
    }
    thumb.addEventListener("click", () => { watch(job); $("current").scrollIntoView({ behavior: "smooth", block: "nearest" }); });
    item.appendChild(thumb);
    const meta = el("div", { class: "meta" });
    const badge = el("span", { class: "badge" }, job.status);
    badge.dataset.status = job.status;
    meta.appendChild(badge);
    meta.appendChild(el("p", { title: job.prompt }, job.prompt));
    if (job.reason && job.status !== "done") meta.appendChild(el("p", { class: "tile-reason" }, job.reason));
    const when = new Date(job.created_at);
    meta.appendChild(el("small", {}, `${job.width}×${job.height} · ${job.steps} steps · ${job.count > 1 ? job.count + " images · " : ""}${when.toLocaleString()}`));
    item.appendChild(meta);
    return item;
  }

  async function loadGallery() {
    const { response, data } = await api("GET", "/api/v1/jobs?page_size=12");
    if (!response.ok || !data) return;
    const jobs = data.results || [];
    $("gallery").replaceChildren(...jobs.map(tile));
    show($("gallery-empty"), jobs.length === 0);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("generate").addEventListener("submit", submit);
    $("cancel").addEventListener("click", cancelCurrent);
    $("refresh").addEventListener("click", loadGallery);
    loadGallery();
  });
})();
