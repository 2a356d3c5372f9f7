// Forms with data-busy take a while on the server (a catalog add resolves and analyses a config; an upload is read
// and analysed): once submitted, the form says it is working (aria-busy, its button disabled and reading the
// data-busy text with a spinner from d0.css) and a second submit (a double click, Enter again) is dropped, so the
// model is not added twice.
(function () {
  "use strict";

  function submitButton(form, submitter) {
    return submitter || form.querySelector("button[type=submit], button:not([type])");
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.dataset || !form.dataset.busy || event.defaultPrevented) { return; }  // not one, or not confirmed
    if (form.getAttribute("aria-busy") === "true") { event.preventDefault(); return; }
    form.setAttribute("aria-busy", "true");
    var button = submitButton(form, event.submitter);
    // Disabled after the browser has read the form's fields: a button disabled before that would drop its own
    // name and value from what is sent.
    window.setTimeout(function () {
      if (!button) { return; }
      button.dataset.idleText = button.textContent;
      button.textContent = form.dataset.busy;
      button.disabled = true;
      button.setAttribute("aria-busy", "true");
    }, 0);
  });

  // Back to a page kept in the browser's cache: its forms are idle again.
  window.addEventListener("pageshow", function (event) {
    if (!event.persisted) { return; }
    document.querySelectorAll("form[data-busy][aria-busy=true]").forEach(function (form) {
      form.removeAttribute("aria-busy");
      form.querySelectorAll("button[aria-busy=true]").forEach(function (button) {
        button.textContent = button.dataset.idleText || button.textContent;
        button.disabled = false;
        button.removeAttribute("aria-busy");
      });
    });
  });
})();
