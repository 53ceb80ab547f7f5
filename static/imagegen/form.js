// imagegen page: the form. Field errors next to their field; a 429 that can never fit says
// so and offers fewer steps or images; a real "busy" counts down its Retry-After.
(function () {
  "use strict";
  const { $, api, el, show, seconds } = window.imagegen;

  const FIELDS = ["prompt", "negative_prompt", "model", "size", "steps", "count", "seed", "guidance_scale", "output_format", "priority", "allow_degrade"];
  const FIELD_OF = { width: "size", height: "size" };  // API field -> form field
  let countdown = null;

  function clearErrors() {
    for (const name of FIELDS) {
      const box = $(`${name}-error`);
      if (box) { box.textContent = ""; show(box, false); }
      const input = $(name);
      if (input) input.removeAttribute("aria-invalid");
    }
    show($("form-error"), false);
  }

  function fieldError(name, message) {
    const box = $(`${name}-error`);
    const input = $(name);
    if (!box || !input) return false;
    box.textContent = box.textContent ? `${box.textContent} ${message}` : message;
    show(box, true);
    input.setAttribute("aria-invalid", "true");
    return true;
  }

  function formError(message) {
    const box = $("form-error");
    box.textContent = message;
    show(box, true);
  }

  // DRF's 400 body: {field: [messages]} (non_field_errors / detail for the whole form).
  function showFieldErrors(data) {
    if (!data || typeof data !== "object") { formError("Something went wrong. Please try again."); return; }
    const rest = [];
    let first = null;
    for (const [key, errors] of Object.entries(data)) {
      const name = FIELD_OF[key] || key;
      const message = [].concat(errors).join(" ");
      if (fieldError(name, message)) first = first || name;
      else rest.push(key === "detail" || key === "non_field_errors" ? message : `${key}: ${message}`);
    }
    if (rest.length) formError(rest.join("\n"));
    if (first) $(first).focus();
  }

  function values(form) {
    const [width, height] = form.size.value.split("x").map(Number);
    const body = {
      prompt: form.prompt.value.trim(), width, height,
      steps: Number(form.steps.value), count: Number(form.count.value),
      output_format: form.output_format.value, priority: form.priority.value, allow_degrade: form.allow_degrade.checked,
    };
    if (form.model && form.model.value) body.model = form.model.value;
    if (form.negative_prompt.value.trim()) body.negative_prompt = form.negative_prompt.value.trim();
    if (form.seed.value !== "") body.seed = Number(form.seed.value);
    if (form.guidance_scale.value !== "") body.guidance_scale = Number(form.guidance_scale.value);
    return body;
  }

  // --- refusals (429) --------------------------------------------------------------------------
  function stopCountdown() {
    if (countdown) { clearInterval(countdown); countdown = null; }
    const button = $("submit");
    button.disabled = false;
    button.textContent = "Generate";
  }

  function clearRefused() {
    stopCountdown();
    show($("refused"), false);
    $("refused-suggestions").replaceChildren();
    show($("refused-countdown"), false);
  }

  function startCountdown(wait) {
    const until = Date.now() + wait * 1000;
    const button = $("submit");
    const line = $("refused-countdown");
    show(line, true);
    const tick = () => {
      const left = Math.ceil((until - Date.now()) / 1000);
      if (left <= 0) {
        stopCountdown();
        line.textContent = "You can try again now.";
        line.dataset.left = "0";
        return;
      }
      line.textContent = `Try again in ${seconds(left)}.`;
      line.dataset.left = String(left);
      button.disabled = true;
      button.textContent = `Try again in ${seconds(left)}`;
    };
    tick();
    countdown = setInterval(tick, 1000);
  }

  function suggestion(label, apply) {
    const button = el("button", { type: "button", class: "secondary" }, label);
    button.addEventListener("click", () => { apply(); clearRefused(); $("submit").focus(); });
    return button;
  }

  // Does the job fit at all? Its own time is its estimate less the wait a one-image job would
  // have now; over the limit even with nothing ahead, waiting never helps.
  async function explainRefusal(data, response, body) {
    const retry = Number(response.headers.get("Retry-After") || data.retry_after || 0);
    const text = $("refused-text");
    const box = $("refused");
    const suggestions = $("refused-suggestions");
    suggestions.replaceChildren();
    box.dataset.kind = "busy";
    if (data.limit === "max_queue_wait" && data.eta_seconds) {
      const limit = Math.max(1, data.eta_seconds - retry);
      let queueWait = 0;
      try {
        const queue = await api("GET", "/api/v1/queue");
        const model = queue.data && queue.data.models && queue.data.models[0];
        queueWait = (model && model.estimated_wait_seconds) || 0;
      } catch (e) { queueWait = 0; }
      const alone = data.eta_seconds - queueWait;
      Object.assign(box.dataset, { eta: String(data.eta_seconds), limit: String(limit), queueWait: String(queueWait) });
      if (alone > limit) {
        box.dataset.kind = "never";
        const share = Math.min(0.9, (limit / alone) * 0.8);
        const steps = Math.max(1, Math.floor(body.steps * share));
        const count = Math.max(1, Math.floor(body.count * share));
        text.textContent = `This job alone needs about ${seconds(alone)}, more than the ${seconds(limit)} `
          + "a job may wait here, so it can never fit, however long you wait. Ask for fewer steps or images:";
        if (steps < body.steps) suggestions.appendChild(suggestion(`Use ${steps} steps`, () => { $("steps").value = String(steps); }));
        if (body.count > 1) {
          suggestions.appendChild(suggestion(`Make ${count} image${count > 1 ? "s" : ""}`, () => { $("count").value = String(count); }));
        }
        show(box, true);
        return;
      }
      text.textContent = `The service is busy: the wait would be about ${seconds(data.eta_seconds)}, over its `
        + `${seconds(limit)} limit.` + (body.allow_degrade ? "" : " Ticking “Allow degrade when busy” may get you in with fewer steps.");
    } else {
      text.textContent = data.detail || "The service is busy.";
    }
    show(box, true);
    if (retry > 0) startCountdown(retry);
  }

  // --- submit ----------------------------------------------------------------------------------
  async function submit(event) {
    event.preventDefault();
    const form = $("generate");
    clearErrors();
    clearRefused();
    show($("reuse-note"), false);
    const body = values(form);
    if (!body.prompt) {
      fieldError("prompt", "Write a prompt first.");
      form.prompt.focus();
      return;
    }
    const button = $("submit");
    button.disabled = true;
    button.textContent = "Submitting…";
    try {
      const { response, data } = await api("POST", "/api/v1/jobs", body);
      if (response.status === 202) {
        window.imagegen.current.watch(data);
        window.imagegen.gallery.load();
      } else if (response.status === 429) {
        await explainRefusal(data || {}, response, body);
      } else if (response.status === 400) {
        showFieldErrors(data);
      } else if (response.status === 401 || response.status === 403) {
        formError("Your session has ended: reload the page and sign in again.");
      } else if (response.status === 503) {
        formError((data && data.detail) || "The service is unavailable right now.");
        show($("refused"), true);
        $("refused-text").textContent = "";
        startCountdown(Number(response.headers.get("Retry-After") || 5));
      } else {
        formError((data && data.detail) || `The service answered ${response.status}. Please try again.`);
      }
    } catch (e) {
      formError("Could not reach the service. Check your connection and try again.");
    } finally {
      if (!countdown) { button.disabled = false; button.textContent = "Generate"; }
    }
  }

  // "Reuse settings": a job's inputs back in the form (the asked-for steps if it was degraded).
  function reuse(job) {
    const form = $("generate");
    form.prompt.value = job.prompt;
    form.negative_prompt.value = job.negative_prompt || "";
    if (form.model && job.model && [...form.model.options].some((o) => o.value === job.model)) {
      form.model.value = job.model;
      modelChosen(false);
    }
    form.size.value = `${job.width}x${job.height}`;
    form.steps.value = String(job.requested_steps || job.steps);
    form.count.value = String(job.count);
    form.seed.value = String(job.seed);
    form.guidance_scale.value = String(job.guidance_scale);
    if (job.output_format) form.output_format.value = job.output_format;
    if (job.priority) form.priority.value = job.priority;
    clearErrors();
    clearRefused();
    const note = $("reuse-note");
    note.textContent = `Settings of “${job.prompt.slice(0, 60)}” loaded (seed ${job.seed}: the same seed gives the same image). Change anything, then Generate.`;
    show(note, true);
    form.scrollIntoView({ behavior: "smooth", block: "start" });
    form.prompt.focus();
  }

  // A model brings its own steps and guidance (a distilled one runs in a few steps).
  function modelChosen(setDefaults) {
    const option = $("model").selectedOptions[0];
    if (!option) return;
    $("steps").max = option.dataset.maxSteps;
    if (setDefaults) {
      $("steps").value = option.dataset.steps;
      $("guidance_scale").value = option.dataset.guidance;
    }
  }

  function init() {
    const form = $("generate");
    if ($("model")) {
      $("model").addEventListener("change", () => modelChosen(true));
      modelChosen(false);
    }
    form.addEventListener("submit", submit);
    form.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        if (!$("submit").disabled) form.requestSubmit();
      }
    });
    for (const name of FIELDS) {
      const input = $(name);
      if (input) input.addEventListener("input", () => {
        const box = $(`${name}-error`);
        if (box) { box.textContent = ""; show(box, false); }
        input.removeAttribute("aria-invalid");
      });
    }
  }

  window.imagegen.form = { init, reuse };
})();
