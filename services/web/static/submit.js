// Before the form is sent: each field's size against its limit, counted as the server counts it
// (the chosen file's bytes, else the text's UTF-8 bytes). A field over its limit is refused here,
// beside the field, and nothing is sent, so the pasted text stays in its box; sent, a request over
// the server's whole-request limit is not read at all and its text could not be shown again.
(function () {
  "use strict";
  const form = document.getElementById("submit-form");
  if (!form) return;
  form.addEventListener("submit", function (event) {
    form.querySelectorAll("textarea[data-max-bytes]").forEach(function (box) {
      const limit = Number(box.getAttribute("data-max-bytes"));
      const file = document.getElementById(box.id + "_file").files[0];
      const size = file ? file.size : new TextEncoder().encode(box.value).length;
      if (size <= limit) return;
      const errors = document.getElementById("errors-" + box.id), item = document.createElement("li");
      const kib = Math.floor(limit / 1024) + " KiB";
      item.textContent = file ? file.name + ": larger than " + kib
        : box.getAttribute("data-file-name") + " is larger than " + kib + " (" + Math.ceil(size / 1024) +
          " KiB): nothing was sent, the text is still here";
      errors.replaceChildren(item);
      document.getElementById("field-" + box.id).classList.add("has-error");
      event.preventDefault();
    });
  });
})();
