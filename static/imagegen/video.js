// imagegen page: a video job's clip (issue 47). A <video> that plays the HLS ladder: natively
// where the browser plays HLS itself and has no MediaSource (Safari on an iPhone), else through
// hls.js (vendored, loaded only when a clip needs it: 380 KB that an image-only page never
// fetches), else the MP4 download itself. Every URL passes the page's safeSrc rule (this origin
// or a configured media origin). The path taken is the video's `data-player` ("native",
// "hls.js", "mp4"), `data-fallback` says what failed before it, and `data-refused="foreign"`
// that a playlist named a file outside those origins.
(function () {
  "use strict";
  const { el, safeSrc } = window.imagegen;

  const HLS_TYPE = "application/vnd.apple.mpegurl";
  // The vendored build's URL, from the template (static files may be renamed when collected).
  const HLS_SRC = (document.currentScript && document.currentScript.dataset.hls) || "";
  const players = new WeakMap(); // <video> -> its hls.js instance, destroyed with the card
  let hlsLoaded = null;

  function loadHls() {
    if (window.Hls) return Promise.resolve(window.Hls);
    if (!hlsLoaded) {
      hlsLoaded = new Promise((resolve, reject) => {
        const tag = el("script", { src: HLS_SRC, async: "" });
        tag.onload = () => (window.Hls ? resolve(window.Hls) : reject(new Error("hls.js did not define Hls")));
        tag.onerror = () => { hlsLoaded = null; tag.remove(); reject(new Error("hls.js did not load")); };
        document.head.appendChild(tag);
      });
    }
    return hlsLoaded;
  }

  function allowed(url) {
    try {
      if (new URL(url, location.href).origin === location.origin) return true;
    } catch (e) { return false; }
    return Boolean(safeSrc(url));
  }

  function nativeHls(video) {
    return !window.MediaSource && /^(probably|maybe)$/.test(video.canPlayType(HLS_TYPE));
  }

  function playFile(video, src, player) {
    video.dataset.player = player;
    video.src = src;
    video.play().catch(() => { /* autoplay refused: the controls are there */ });
  }

  function playMp4(video, mp4, failed) {
    if (failed) video.dataset.fallback = failed;
    if (mp4) playFile(video, mp4, "mp4");
    else video.dataset.player = "none";
  }

  async function start(video, playlist, mp4) {
    if (!playlist) { playMp4(video, mp4); return; }
    if (nativeHls(video)) { playFile(video, playlist, "native"); return; }
    // hls.js needs MediaSource (ManagedMediaSource on iOS 17+): without one, do not fetch it.
    if (!(window.MediaSource || window.ManagedMediaSource)) { playMp4(video, mp4); return; }
    let Hls;
    try { Hls = await loadHls(); } catch (e) { playMp4(video, mp4, "hls.js"); return; }
    if (!video.isConnected) return; // the card went while hls.js loaded
    if (!Hls.isSupported()) { playMp4(video, mp4); return; }
    // The playlists name their segments: each request passes the same rule as the page's own
    // URLs (hls.js hands them over resolved, so this origin's come absolute), or fails, and a
    // fatal failure falls back to the MP4.
    const hls = new Hls({
      enableWorker: false,
      xhrSetup: (xhr, url) => { if (!allowed(url)) throw new Error(`not a media origin: ${url}`); },
    });
    players.set(video, hls);
    video.dataset.player = "hls.js";
    const fail = (why) => {
      if (players.get(video) !== hls) return;
      if (why) video.dataset.refused = why;
      hls.destroy();
      players.delete(video);
      playMp4(video, mp4, "hls.js");
    };
    // A playlist that names a file elsewhere is refused at once (its requests would only fail).
    const foreign = (urls) => urls.some((url) => typeof url === "string" && !allowed(url));
    hls.on(Hls.Events.ERROR, (_event, data) => { if (data.fatal) fail(); });
    hls.on(Hls.Events.MANIFEST_PARSED, (_event, data) => {
      if (foreign(data.levels.map((level) => level.url))) { fail("foreign"); return; }
      video.play().catch(() => { /* autoplay refused: the controls are there */ });
    });
    hls.on(Hls.Events.LEVEL_LOADED, (_event, data) => {
      const fragments = data.details.fragments;
      if (foreign(fragments.flatMap((frag) => [frag.url, frag.initSegment && frag.initSegment.url]))) fail("foreign");
    });
    hls.loadSource(playlist);
    hls.attachMedia(video);
  }

  function downloadName(job) {
    return `imagegen-${String(job.id).slice(0, 8)}-seed${job.seed}.mp4`;
  }

  // A figure with the player and a download link, or null when no URL of the clip is allowed.
  function player(job, clip) {
    const mp4 = safeSrc(clip && clip.url);
    const playlist = safeSrc(clip && clip.playlist_url);
    if (!mp4 && !playlist) return null;
    const poster = safeSrc(clip.poster_url);
    const attrs = {
      controls: "", muted: "", playsinline: "", loop: "", autoplay: "", preload: "auto", class: "final-video",
      "aria-label": `Generated video for: ${job.prompt}`,
    };
    if (poster) attrs.poster = poster;
    if (clip.width) attrs.width = String(clip.width);
    if (clip.height) attrs.height = String(clip.height);
    const video = el("video", attrs);
    video.muted = true; // the attribute sets only the default; autoplay needs the property
    const figure = el("figure", { class: "result video" });
    figure.appendChild(video);
    const caption = el("figcaption", { class: "muted" });
    const facts = [];
    if (clip.seconds) facts.push(`${clip.seconds} s`);
    if (clip.frames) facts.push(`${clip.frames} frames`);
    if (clip.fps) facts.push(`${clip.fps} fps`);
    caption.appendChild(el("span", { class: "seed" }, [`seed ${job.seed}`, ...facts].join(" · ")));
    if (mp4) {
      caption.appendChild(document.createTextNode(" · "));
      caption.appendChild(el("a", { href: mp4, download: downloadName(job), class: "download" }, "Download MP4"));
    }
    figure.appendChild(caption);
    start(video, playlist, mp4);
    return figure;
  }

  // The player of the job's first clip, appended to `box`; false when there is none to show.
  function show(box, job) {
    const clips = Array.isArray(job.videos) ? job.videos : [];
    const figure = clips.length ? player(job, clips[0]) : null;
    if (figure) box.appendChild(figure);
    return Boolean(figure);
  }

  // Stop the players inside `box` before it is emptied (hls.js holds a MediaSource and timers).
  function release(box) {
    for (const video of box.querySelectorAll("video")) {
      const hls = players.get(video);
      if (hls) { hls.destroy(); players.delete(video); }
      video.removeAttribute("src");
      video.load();
    }
  }

  // What a gallery tile shows of a video job: its poster, or "".
  function posterOf(job) {
    const clip = Array.isArray(job.videos) && job.videos.length ? job.videos[0] : null;
    return clip ? safeSrc(clip.poster_url) : "";
  }

  window.imagegen.video = { show, release, posterOf, downloadName };
})();
