// Filters the streams and whats tables as you type; ?q=words in the address fills the box (a shareable view).
const box = document.getElementById("search");
const shown = document.getElementById("shown");
const rows = Array.from(document.querySelectorAll("tr[data-search]"));
function filter() {
  const words = box.value.toLowerCase().split(/\s+/).filter(Boolean);
  const counts = { stream: [0, 0], what: [0, 0] };
  for (const row of rows) {
    const hit = words.every((word) => row.dataset.search.includes(word));
    row.hidden = !hit;
    const count = counts[row.dataset.kind || "stream"];
    count[0] += hit ? 1 : 0;
    count[1] += 1;
  }
  for (const section of document.querySelectorAll("section.tap, section.whats")) {
    section.hidden = words.length > 0 && !section.querySelector("tr[data-search]:not([hidden])");
  }
  const texts = [];
  if (counts.stream[1] || !counts.what[1]) texts.push(counts.stream[0] + " of " + counts.stream[1] + " streams");
  if (counts.what[1]) texts.push(counts.what[0] + " of " + counts.what[1] + " whats");
  shown.textContent = texts.join(", ");
}
box.value = new URLSearchParams(location.search).get("q") || "";
box.addEventListener("input", filter);
filter();
