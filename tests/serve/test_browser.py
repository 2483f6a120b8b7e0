"""The search page in real headless Chromium (Debian's, driven by Playwright; `make test` installs it)."""

import shutil

import pytest

from conftest import serving, shape_image, shape_index

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make test installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from openalign.serve.app import create_app

    root = tmp_path_factory.mktemp("browser")
    index = shape_index(root)
    shape_image("blue", "square").save(root / "query.png")
    with serving(create_app([str(index), f"more={index}"])) as url:  # two names: the page offers a choice
        yield url, root / "query.png"


def loaded_thumbnails(page, expected: int) -> int:
    """Wait until the grid holds `expected` thumbnails that have all loaded; their number."""
    page.wait_for_function(f"[...document.querySelectorAll('#results img')].filter("
                           f"i => i.complete && i.naturalWidth > 0).length === {expected}")
    return page.evaluate("[...document.querySelectorAll('#results img')].filter(i => i.naturalWidth > 0).length")


def test_type_a_query_upload_an_image_add_a_term_and_see_thumbnails(server):
    from playwright.sync_api import sync_playwright

    url, query_image = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 2000})  # every thumbnail in view (lazy loading)
        page.goto(url)
        page.wait_for_function("document.getElementById('status').textContent.includes('12 images')")
        page.fill("#text", "a red circle")
        page.fill("#k", "6")
        with page.expect_response("**/search") as response:
            page.press("#text", "Enter")
        assert response.value.status == 200
        assert loaded_thumbnails(page, 6) == 6
        assert page.locator("#results figcaption").first.inner_text().startswith("0.")  # a score
        # an image and a "+ text" term: the request carries both, and the grid is redrawn
        page.set_input_files("#file", str(query_image))
        page.wait_for_selector("#preview:not([hidden])")
        page.click("#add-plus")
        page.fill(".term[data-sign=plus] input", "red")
        page.fill("#text", "")
        page.evaluate("document.getElementById('results').replaceChildren()")  # so the new grid is what loads
        with page.expect_request("**/search") as request:
            page.click("#go")
        body = request.value.post_data_json
        assert body["plus"] == ["red"] and body["image"] and body["text_weight"] == 2
        assert loaded_thumbnails(page, 6) == 6
        # a bad upload shows the server's message instead of results
        page.set_input_files("#file", {"name": "x.png", "mimeType": "image/png", "buffer": b"not a png"})
        page.wait_for_timeout(200)
        page.click("#go")
        page.wait_for_selector("#error:not([hidden])")
        assert "not a readable image" in page.inner_text("#error")
        # the second index, chosen from the page: the request names it and its thumbnails load from it
        page.click("#clear-image")
        page.fill("#text", "a blue square")
        page.evaluate("document.getElementById('results').replaceChildren()")
        with page.expect_request("**/search") as request:
            page.select_option("#index", "more|image")
        assert request.value.post_data_json["index"] == "more"
        assert loaded_thumbnails(page, 6) == 6
        assert page.locator("#results img").first.get_attribute("src").endswith("?index=more")
        browser.close()
