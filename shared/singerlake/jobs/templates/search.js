// Filters the streams tables as you type; ?q=words in the address fills the box (a shareable view).
const box = document.getElementById("search");
const shown = document.getElementById("shown");
const rows = Array.from(document.querySelectorAll("tr[data-search]"));
function filter() {
  const words = box.value.toLowerCase().split(/\s+/).filter(Boolean);
  let count = 0;
  for (const row of rows) {
    const hit = words.every((word) => row.dataset.search.includes(word));
    row.hidden = !hit;
    count += hit ? 1 : 0;
  }
  for (const section of document.querySelectorAll("section.tap")) {
    section.hidden = words.length > 0 && !section.querySelector("tr[data-search]:not([hidden])");
  }
  shown.textContent = count + " of " + rows.length + " streams";
}
box.value = new URLSearchParams(location.search).get("q") || "";
box.addEventListener("input", filter);
filter();
