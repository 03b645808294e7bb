/* memory_app admin: "Expand all" / "Collapse all" for the transcript's tool calls and folded
   text. Everything else on the page works without JavaScript. */
"use strict";
document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-mem-toggle-all]").forEach(function (button) {
        button.addEventListener("click", function () {
            var log = document.querySelector(".mem-log");
            if (!log) {
                return;
            }
            var open = button.getAttribute("aria-pressed") !== "true";
            log.querySelectorAll("details").forEach(function (details) {
                details.open = open;
            });
            button.setAttribute("aria-pressed", open ? "true" : "false");
            button.textContent = open ? "Collapse all" : "Expand all";
        });
    });
});
