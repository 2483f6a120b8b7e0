// openalign search page: builds a /search request from the form and draws the results grid.
"use strict";

const $ = (id) => document.getElementById(id);
let imageData = null;  // base64 of the chosen file
let imageId = null;    // or an indexed image, chosen from the results

function addTerm(sign, value = "") {
  const row = document.createElement("div");
  row.className = "term";
  row.dataset.sign = sign;
  row.innerHTML = `<span class="sign">${sign === "plus" ? "+" : "−"}</span>
    <input type="text" placeholder="${sign === "plus" ? "add" : "remove"} a concept" aria-label="${sign} text">
    <button type="button" class="small" aria-label="remove term">×</button>`;
  row.querySelector("input").value = value;
  row.querySelector("button").onclick = () => row.remove();
  $("terms").appendChild(row);
  row.querySelector("input").focus();
}

function setImage(file) {
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    imageData = reader.result.split(",", 2)[1];
    imageId = null;
    $("preview").src = reader.result;
    showImage(true);
  };
  reader.readAsDataURL(file);
}

function showImage(on) {
  $("preview").hidden = !on;
  $("clear-image").hidden = !on;
  $("drop-label").hidden = on;
}

function terms(sign) {
  return [...document.querySelectorAll(`.term[data-sign=${sign}] input`)].map((i) => i.value.trim()).filter(Boolean);
}

async function run(event) {
  if (event) event.preventDefault();
  const body = {
    text: $("text").value, plus: terms("plus"), minus: terms("minus"),
    text_weight: Number($("text-weight").value), image_weight: Number($("image-weight").value),
    k: Number($("k").value),
  };
  const [index, modality] = ($("index").value || "|").split("|");
  if (index) { body.index = index; body.modality = modality; }
  if (imageData) body.image = imageData;
  if (imageId !== null) body.image_id = imageId;
  $("error").hidden = true;
  const response = await fetch("/search", {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  const data = await response.json();
  if (!response.ok) {
    const detail = Array.isArray(data.detail) ? data.detail.map((d) => d.msg).join("; ") : data.detail;
    $("error").textContent = detail || `error ${response.status}`;
    $("error").hidden = false;
    return;
  }
  draw(data.results);
}

function draw(results) {
  const grid = $("results");
  grid.replaceChildren();
  for (const r of results) {
    const figure = document.createElement("figure");
    figure.className = "result";
    const img = document.createElement("img");
    img.src = r.thumbnail;
    img.alt = r.caption || r.path || `image ${r.id}`;
    img.loading = "lazy";
    const caption = document.createElement("figcaption");
    caption.innerHTML = `<span class="score">${r.score.toFixed(3)}</span> #${r.id}<br>`;
    caption.append(r.caption || (r.path || "").split("/").pop());
    const use = document.createElement("span");
    use.className = "link query-image";
    use.textContent = "search with this image";
    use.onclick = () => { imageId = r.id; imageData = null; $("preview").src = r.thumbnail; showImage(true); run(); };
    caption.append(document.createElement("br"), use);
    figure.append(img, caption);
    grid.append(figure);
  }
  if (!results.length) grid.textContent = "No results.";
}

$("query").addEventListener("submit", run);
$("add-plus").onclick = () => addTerm("plus");
$("add-minus").onclick = () => addTerm("minus");
$("file").onchange = (e) => setImage(e.target.files[0]);
$("clear-image").onclick = () => { imageData = null; imageId = null; showImage(false); $("file").value = ""; };
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); setImage(e.dataTransfer.files[0]); });
// the indexes this service answers (a name's image vectors, and its captions' vectors when it has them)
fetch("/health").then((r) => r.json()).then((h) => {
  const choice = $("index");
  for (const [name, modalities] of Object.entries(h.indices || {})) {
    for (const [modality, info] of Object.entries(modalities)) {
      const option = new Option(`${name}${modality === "text" ? " (captions)" : ""}`, `${name}|${modality}`);
      option.dataset.status = `${info.count.toLocaleString()} ${modality === "text" ? "captions" : "images"}, ${info.kind} index`;
      choice.add(option);
    }
  }
  const status = () => { $("status").textContent = choice.selectedOptions[0]?.dataset.status || ""; };
  $("index-choice").hidden = choice.options.length < 2;
  choice.onchange = () => {
    if (imageId !== null) { imageId = null; showImage(false); }  // an id of the other index
    status();
    if ($("text").value || imageData) run();
  };
  status();
});
