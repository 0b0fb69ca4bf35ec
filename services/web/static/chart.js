// Hovering a point of the history chart shows which attempt it is (the text of its SVG <title>,
// moved into a tooltip so the browser's own slower tooltip does not double it).
(function () {
  "use strict";
  document.querySelectorAll(".chart").forEach(function (chart) {
    const tip = chart.querySelector(".tip");
    if (!tip) return;
    chart.querySelectorAll(".pt").forEach(function (point) {
      const title = point.querySelector("title");
      if (title) { point.setAttribute("data-tip", title.textContent); title.remove(); }
      point.addEventListener("mouseenter", function () {
        const box = point.getBoundingClientRect(), frame = chart.getBoundingClientRect();
        tip.textContent = point.getAttribute("data-tip");
        tip.style.left = (box.left + box.width / 2 - frame.left) + "px";
        tip.style.top = (box.top - frame.top) + "px";
        tip.hidden = false;
        point.classList.add("active");
      });
      point.addEventListener("mouseleave", function () { tip.hidden = true; point.classList.remove("active"); });
    });
  });
})();
