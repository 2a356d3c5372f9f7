// The job form: each stage's parameters are shown only while that stage is ticked (without JavaScript all are).
(function () {
  "use strict";
  var form = document.getElementById("job-form");
  if (!form) { return; }
  function update() {
    var ticked = {};
    form.querySelectorAll("input[name=stages]").forEach(function (box) { ticked[box.value] = box.checked; });
    form.querySelectorAll("fieldset.stage-parameters").forEach(function (set) {
      set.hidden = !ticked[set.dataset.stage];
    });
  }
  form.addEventListener("change", update);
  update();
})();
