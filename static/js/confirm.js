// Forms with data-confirm ask before they submit (cancelling a job stops its running stages).
document.addEventListener("submit", function (event) {
  var message = event.target.dataset ? event.target.dataset.confirm : null;
  if (message && !window.confirm(message)) { event.preventDefault(); }
}, true);
