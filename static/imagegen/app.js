// imagegen page: wiring. util.js (helpers), form.js (the form), current.js (the job being
// watched), gallery.js (your images) each add themselves to window.imagegen.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", () => {
    const { form, current, gallery } = window.imagegen;
    form.init();
    current.init();
    // After a reload the job being made (or held, or appealed) is the current job again.
    gallery.init().then((jobs) => current.restore(jobs));
  });
})();
