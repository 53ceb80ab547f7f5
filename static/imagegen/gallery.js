// imagegen page: the gallery. Every image of every job, newest first, paged by the API's
// cursor links; per image the seed and a full-size download; per job "reuse settings" and delete.
// A tile is built again only when its job changed (an open Verify panel stays open); a running
// tile follows the progress events of the job being watched (current.js calls follow), and the
// page asks again while another job of the page is queued or running.
(function () {
  "use strict";
  const { $, api, el, safeSrc, samePath, show, downloadName } = window.imagegen;

  const PAGE_SIZE = 12;
  const FIRST = `/api/v1/jobs?page_size=${PAGE_SIZE}`;
  const ACTIVE_POLL_MS = 4000;
  const gallery = { url: FIRST, page: 1, next: "", previous: "", loading: null, tiles: new Map(), steps: new Map(), poll: null };

  // What a tile shows of a job; the estimate's countdown and queue position are not shown.
  function signature(job) {
    return JSON.stringify({ ...job, eta_seconds: null, queue_position: null });
  }

  // The step a running tile shows: the job's own, or further where an event said so.
  function stepOf(job) {
    const seen = gallery.steps.get(job.id);
    const own = job.progress ? job.progress.step : 0;
    return seen ? Math.max(own, seen.step) : own;
  }

  function progressText(thumbs, step, total) {
    thumbs.textContent = `running ${step}/${total}`;
    thumbs.dataset.step = String(step);
    thumbs.dataset.total = String(total);
  }

  function meta(job) {
    const when = new Date(job.created_at);
    const parts = [`${job.width}×${job.height}`, `${job.steps} steps`];
    if (job.count > 1) parts.push(`${job.count} images`);
    if (job.output_format && job.output_format !== "png") parts.push(job.output_format.toUpperCase());
    parts.push(when.toLocaleString());
    return parts.join(" · ");
  }

  function tile(job) {
    const item = el("li", { class: "tile", "data-job": job.id });
    const images = (job.images || []).filter((image) => safeSrc(image.url));
    const thumbs = el("button", {
      type: "button", class: `thumbs n${Math.min(images.length, 4)}`, "aria-label": `Show job: ${job.prompt}`,
    });
    if (images.length) {
      for (const image of images) {
        thumbs.appendChild(el("img", {
          src: safeSrc(image.url), alt: `${job.prompt} (seed ${image.seed})`, loading: "lazy",
          width: String(image.width), height: String(image.height),
        }));
      }
    } else if (window.imagegen.video.posterOf(job)) {
      thumbs.classList.add("poster");
      thumbs.appendChild(el("img", { src: window.imagegen.video.posterOf(job), alt: `${job.prompt} (video)`, loading: "lazy" }));
    } else if (job.status === "running") {
      progressText(thumbs, stepOf(job), job.progress.total || job.steps);
    } else {
      thumbs.textContent = job.status;
    }
    thumbs.addEventListener("click", () => {
      window.imagegen.current.watch(job);
      $("current").scrollIntoView({ behavior: "smooth", block: "nearest" });
    });
    item.appendChild(thumbs);

    const info = el("div", { class: "meta" });
    const badge = el("span", { class: "badge" }, job.status);
    badge.dataset.status = job.status;
    info.appendChild(badge);
    info.appendChild(el("p", { title: job.prompt, class: "tile-prompt" }, job.prompt));
    if (typeof job.revised_prompt === "string" && job.revised_prompt && job.revised_prompt !== job.prompt) {
      info.appendChild(el("p", { class: "tile-revised hint", title: job.revised_prompt }, `revised: ${job.revised_prompt}`));
    }
    if (job.reason && job.status !== "done") info.appendChild(el("p", { class: "tile-reason", "data-status": job.status }, job.reason));
    info.appendChild(el("small", {}, meta(job)));
    if (images.length) {
      const files = el("ul", { class: "files" });
      for (const image of images) {
        const row = el("li");
        row.appendChild(el("span", { class: "seed" }, `seed ${image.seed}`));
        row.appendChild(document.createTextNode(" "));
        row.appendChild(el("a", { href: safeSrc(image.url), download: downloadName(job, image), class: "download" },
          images.length > 1 ? `Download #${image.index + 1}` : "Download"));
        const [verify, panel] = window.imagegen.verify.link(image, true);
        row.appendChild(document.createTextNode(" · "));
        row.appendChild(verify);
        row.appendChild(panel);
        files.appendChild(row);
      }
      info.appendChild(files);
    } else {
      info.appendChild(el("small", { class: "seed" }, `seed ${job.seed}`));
      const mp4 = Array.isArray(job.videos) && job.videos.length ? safeSrc(job.videos[0].url) : "";
      if (mp4) info.appendChild(el("a", { href: mp4, download: window.imagegen.video.downloadName(job), class: "download" }, "Download MP4"));
    }
    const actions = el("div", { class: "tile-actions" });
    const reuse = el("button", { type: "button", class: "link reuse" }, "Reuse settings");
    reuse.addEventListener("click", () => window.imagegen.form.reuse(job));
    const remove = el("button", { type: "button", class: "link delete" }, "Delete");
    remove.addEventListener("click", () => deleteJob(job, remove));
    actions.appendChild(reuse);
    actions.appendChild(remove);
    info.appendChild(actions);
    item.appendChild(info);
    return item;
  }

  async function deleteJob(job, button) {
    if (!window.confirm(`Delete this job and its ${job.count > 1 ? job.count + " images" : "image"}? This cannot be undone.`)) return;
    button.disabled = true;
    const { response } = await api("DELETE", `/api/v1/jobs/${job.id}`);
    if (response.status === 204 || response.status === 404) {
      const current = window.imagegen.current.job;
      if (current && current.id === job.id) show($("current"), false);
      load();
    } else {
      button.disabled = false;
    }
  }

  async function load(url) {
    if (url !== undefined) gallery.url = url;
    const wanted = gallery.url;
    const { response, data } = await api("GET", wanted);
    if (!response.ok || !data || wanted !== gallery.url) return;
    const jobs = data.results || [];
    if (!jobs.length && gallery.page > 1) { gallery.page = 1; return load(FIRST); }
    const tiles = new Map();
    for (const job of jobs) {
      const sig = signature(job);
      const kept = gallery.tiles.get(job.id);
      tiles.set(job.id, kept && kept.sig === sig ? kept : { sig, node: tile(job) });
    }
    gallery.tiles = tiles;
    const nodes = [...tiles.values()].map((t) => t.node);
    const list = $("gallery");
    if (nodes.length !== list.children.length || nodes.some((node, i) => list.children[i] !== node)) list.replaceChildren(...nodes);
    pollWhileActive(jobs);
    show($("gallery-empty"), jobs.length === 0);
    gallery.next = samePath(data.next);
    gallery.previous = samePath(data.previous);
    show($("older"), Boolean(gallery.next));
    show($("newer"), Boolean(gallery.previous));
    $("page-label").textContent = gallery.next || gallery.previous ? `Page ${gallery.page}` : "";
    return jobs;
  }

  // Another job on this page queued or running (the watched one follows its own events): ask
  // again in a while, until none is.
  function pollWhileActive(jobs) {
    const watched = window.imagegen.current.job;
    const active = jobs.some((job) => (job.status === "queued" || job.status === "running") && !(watched && watched.id === job.id));
    if (active && !gallery.poll) gallery.poll = setInterval(() => load(), ACTIVE_POLL_MS);
    else if (!active && gallery.poll) { clearInterval(gallery.poll); gallery.poll = null; }
  }

  // A progress event of a job (current.js): its tile, if on this page and still without images,
  // shows the step.
  function follow(jobId, step, total) {
    const seen = gallery.steps.get(jobId);
    if (seen && seen.step > step) return;
    gallery.steps.set(jobId, { step, total });
    const item = gallery.tiles.get(jobId);
    if (!item) return;
    const thumbs = item.node.querySelector(".thumbs");
    if (thumbs && !thumbs.querySelector("img")) progressText(thumbs, step, total);
    const badge = item.node.querySelector(".badge");
    if (badge && badge.dataset.status === "queued") { badge.textContent = "running"; badge.dataset.status = "running"; }
  }

  function init() {
    $("refresh").addEventListener("click", () => load());
    $("older").addEventListener("click", () => { if (gallery.next) { gallery.page += 1; load(gallery.next); } });
    $("newer").addEventListener("click", () => {
      if (gallery.previous) { gallery.page = Math.max(1, gallery.page - 1); load(gallery.page === 1 ? FIRST : gallery.previous); }
    });
    return load();
  }

  window.imagegen.gallery = { init, follow, load: () => load() };
})();
