// The eventbus console's only script: while an event is still being processed
// (or was just replayed), reload its page every two seconds to show the outcome.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var status = document.getElementById("event-status");
  if (!status) { return; }
  var state = status.getAttribute("data-status");
  if (state === "PROCESSING" || state === "PENDING" || state === "FAILED(retrying)") {
    window.setTimeout(function () { window.location.reload(); }, 2000);
  }
});
