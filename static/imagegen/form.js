// imagegen page: the form. Field errors next to their field; a 429 that can never fit says
// so and offers fewer steps or images; a real "busy" counts down its Retry-After.
(function () {
  "use strict";
  const { $, api, el, show, seconds } = window.imagegen;

  const FIELDS = ["prompt", "negative_prompt", "model", "quality", "size", "steps", "count", "seed", "guidance_scale", "output_format", "priority", "allow_degrade", "rewrite"];
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
    if (form.rewrite) body.rewrite = form.rewrite.checked ? "on" : "off";
    if (form.model && form.model.value) body.model = form.model.value;
    if (form.quality && form.quality.value && form.quality.value !== "auto") body.quality = form.quality.value;
    if (!form.negative_prompt.disabled && form.negative_prompt.value.trim()) body.negative_prompt = form.negative_prompt.value.trim();
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
        refreshChoices(true);
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
    if (form.quality) form.quality.value = "auto";  // the job's steps are in the form already
    describe();
    clearErrors();
    clearRefused();
    const note = $("reuse-note");
    note.textContent = `Settings of “${job.prompt.slice(0, 60)}” loaded (seed ${job.seed}: the same seed gives the same image). Change anything, then Generate.`;
    show(note, true);
    form.scrollIntoView({ behavior: "smooth", block: "start" });
    form.prompt.focus();
  }

  // --- the choices: model, quality tier, priority -------------------------------------------
  // The served catalogue (page.py: each model's steps at its defaults and at each tier), the
  // wait estimate a new job gets now (GET /api/v1/queue) and the quota each priority draws on
  // (GET /api/v1/account), shown beside the choice.
  const CATALOGUE = JSON.parse(($("catalogue") || {}).textContent || "[]");
  const TIER_NAME = { auto: "default", low: "low", medium: "medium", high: "high" };
  const live = { queue: null, account: null, at: 0, loading: null };

  function chosenModel() {
    const version = $("model") ? $("model").value : "";
    return CATALOGUE.find((m) => m.version === version) || CATALOGUE.find((m) => m.default) || CATALOGUE[0];
  }

  function tierOf(model) {
    const quality = $("quality") ? $("quality").value : "auto";
    return (model && model.tiers && model.tiers[quality]) || { steps: model ? model.default_steps : 0, levers: "" };
  }

  async function loadLive(force) {
    if (!force && Date.now() - live.at < 5000) return;
    if (live.loading) return live.loading;
    live.loading = (async () => {
      try {
        const [queue, account] = await Promise.all([api("GET", "/api/v1/queue"), api("GET", "/api/v1/account")]);
        if (queue.response.ok) live.queue = queue.data;
        if (account.response.ok) live.account = account.data;
        live.at = Date.now();
      } catch (e) { /* the hint keeps what it had */ }
      live.loading = null;
    })();
    return live.loading;
  }

  // A whole number within [min, max] typed in `input`, else null (the summary never repeats an
  // invalid value: it says what is allowed instead). Empty: `fallback`.
  function within(input, min, max, fallback) {
    if (input.value.trim() === "") return fallback;
    const value = Number(input.value);
    return Number.isInteger(value) && value >= min && value <= max ? value : null;
  }

  function describe() {
    const info = $("choice-info");
    const model = chosenModel();
    if (!info || !model) return;
    const quality = $("quality") ? $("quality").value : "auto";
    const steps = within($("steps"), model.min_steps, model.max_steps, tierOf(model).steps);
    const count = within($("count"), 1, Number($("count").max) || 1, 1);
    const priority = $("priority").value;
    const levers = tierOf(model).levers;
    const tier = `${model.label}, ${TIER_NAME[quality] || quality} quality`;
    const frames = model.frames > 1 ? model.frames : 1;
    const per = frames > 1 ? `per clip of ${frames} frames` : "per image";
    $("choice-work").textContent = steps === null
      ? `${tier}: ${model.min_steps} to ${model.max_steps} steps ${per}.`
      : `${tier}: ${steps} step${steps === 1 ? "" : "s"} ${per}${levers ? ` (${levers})` : ""}.`;
    const lane = live.queue && (live.queue.models || []).find((m) => m.version === model.version);
    let time = "";
    if (lane) {
      if (lane.estimated_wait_seconds === null || lane.estimated_wait_seconds === undefined) {
        time = lane.active_workers ? "" : "No GPU worker runs this model right now: a job waits until one starts.";
      } else {
        time = `A one-image job at ${lane.default_steps} steps would be ready ${lane.estimated_wait_seconds < 1 ? "in under a second" : `in about ${seconds(lane.estimated_wait_seconds)}`} now`
          + ` (${lane.queued_images} image${lane.queued_images === 1 ? "" : "s"} queued).`;
      }
      info.dataset.eta = lane.estimated_wait_seconds === null ? "" : String(lane.estimated_wait_seconds);
    }
    $("choice-time").textContent = time;
    const quota = live.account && live.account[priority];
    // A clip is charged as its frames' worth of images (jobs/pipeline/submit.py).
    $("choice-cost").textContent = quota && count !== null
      ? `Costs ${count * frames} of your ${quota.max_images_per_day} ${priority} images a day (${quota.images_today} used)`
        + `${frames > 1 ? `: ${count} clip${count === 1 ? "" : "s"} of ${frames} frames` : ""}.`
        + (priority === "batch" ? " Batch runs when the GPUs are free of interactive work." : "")
      : "";
    Object.assign(info.dataset, { model: model.version, quality, steps: steps === null ? "" : String(steps), priority });
  }

  // A model that takes no negative prompt (its guidance is distilled in): the field is off and
  // says why; what was typed stays for a model that takes one.
  function negativeFor(model) {
    const takes = !model || model.negative_prompt !== false;
    $("negative_prompt").disabled = !takes;
    const note = $("negative_prompt-note");
    if (note) { note.textContent = takes ? "" : `${model.negative_note || `${model.label} takes no negative prompt`}.`; show(note, !takes); }
  }

  async function refreshChoices(force) {
    describe();
    await loadLive(force);
    describe();
  }

  // A model brings its own steps and guidance (a distilled one runs in a few steps); a tier its
  // steps on that model.
  function modelChosen(setDefaults) {
    const option = $("model").selectedOptions[0];
    if (!option) return;
    $("steps").max = option.dataset.maxSteps;
    $("steps").min = option.dataset.minSteps;
    if (setDefaults) {
      $("steps").value = String(tierOf(chosenModel()).steps || option.dataset.steps);
      $("guidance_scale").value = option.dataset.guidance;
    }
    negativeFor(chosenModel());
    sizesFor(chosenModel());
    describe();
  }

  // A model that draws only some sizes (a video model: docs/video.md) offers only those; the
  // size chosen moves to the first it draws.
  function sizesFor(model) {
    const allowed = model && model.sizes && model.sizes.length ? model.sizes : null;
    const select = $("size");
    for (const option of select.options) option.disabled = Boolean(allowed) && !allowed.includes(option.value);
    if (select.selectedOptions[0] && select.selectedOptions[0].disabled) {
      select.value = [...select.options].find((o) => !o.disabled).value;
    }
  }

  function qualityChosen() {
    const model = chosenModel();
    if (model) $("steps").value = String(tierOf(model).steps);
    describe();
  }

  function init() {
    const form = $("generate");
    if ($("model")) {
      $("model").addEventListener("change", () => modelChosen(true));
      modelChosen(false);
    }
    if ($("quality")) $("quality").addEventListener("change", qualityChosen);
    $("priority").addEventListener("change", () => refreshChoices(true));
    for (const name of ["steps", "count"]) $(name).addEventListener("input", describe);
    refreshChoices(true);
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
