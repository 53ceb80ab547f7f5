// imagegen page: shared helpers. Plain JS, no build. User text only ever goes through
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

  // Where an image may come from: a path on this origin, a data: preview, or one of the media
  // origins the server configured (object storage, a CDN), stated in the page's meta tag and
  // never taken from a URL. Anything else (another host, "//host", "/\\host", javascript:) is "".
  const MEDIA_ORIGINS = ((document.querySelector('meta[name="imagegen-media-origins"]') || {}).content || "")
    .split(/\s+/).filter(Boolean);

  function safeSrc(url) {
    if (typeof url !== "string") return "";
    if (url.startsWith("data:image/")) return url;
    if (/^\/(?![\/\\])/.test(url)) return url;
    try {
      const parsed = new URL(url);
      if ((parsed.protocol === "https:" || parsed.protocol === "http:") && MEDIA_ORIGINS.includes(parsed.origin)) {
        return parsed.href;
      }
    } catch (e) { /* not an absolute URL */ }
    return "";
  }

  // A same-origin path from an API link (DRF's cursor links are absolute).
  function samePath(url) {
    if (!url) return "";
    try {
      const parsed = new URL(url, location.href);
      return parsed.origin === location.origin ? parsed.pathname + parsed.search : "";
    } catch (e) { return ""; }
  }

  function show(node, visible) { node.hidden = !visible; }

  function seconds(value) {
    const s = Math.max(0, Math.round(value));
    if (s < 90) return `${s} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    return `${Math.round(s / 3600)} h`;
  }

  function extension(url) {
    const match = /\.([a-z0-9]+)(?:$|\?)/.exec(url || "");
    return match ? match[1] : "png";
  }

  function downloadName(job, image) {
    return `imagegen-${String(job.id).slice(0, 8)}-${image.index + 1}-seed${image.seed}.${extension(image.url)}`;
  }

  window.imagegen = { TERMINAL, $, api, el, safeSrc, samePath, show, seconds, extension, downloadName };
})();
