// imagegen page: wiring. util.js (helpers), form.js (the form), current.js (the job being
// watched), gallery.js (your images) each add themselves to window.imagegen.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", () => {
    const { form, current, gallery } = window.imagegen;
    form.init();
    current.init();
    gallery.init();
  });
})();
