"""The live view in a real browser: headless Chromium (Debian's, driven through ChromeDriver
by selenium) loads `llada-rt serve`'s page, types the README's prompt, generates on the
embedded model, reads the final text from the page, checks that the canvas ends with no mask,
and saves a screenshot.

usage: python browser.py LLADA_RT ARTIFACT SCREENSHOT.png [serve args...]
"""

import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from server import Server, run_text

FILL = "FILL:3000705000000920000040015000608000070060300000004000000800900010="


def main():
    binary, artifact, screenshot, *serve_args = sys.argv[1:]
    expected, _ = run_text(binary, artifact, FILL, "--gen-len", "64", "--steps", "64")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    # This machine's network is closed: no background connections, no first-run work.
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1200,900"]:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as profile, Server(binary, artifact, *serve_args) as server:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.get(server.url + "/")
            driver.find_element(By.ID, "prompt").send_keys(FILL)
            for field, value in [("gen_len", "64"), ("steps", "64")]:
                box = driver.find_element(By.ID, field)
                box.clear()
                box.send_keys(value)
            driver.find_element(By.ID, "go").click()
            WebDriverWait(driver, 120).until(lambda d: d.execute_script("return document.body.dataset.state") in ("done", "error"))
            state = driver.execute_script("return document.body.dataset.state")
            answer = driver.find_element(By.ID, "answer").text
            cells = driver.find_elements(By.CSS_SELECTOR, "#canvas .cell")
            masked = driver.find_elements(By.CSS_SELECTOR, "#canvas .cell.mask")
            stats = driver.find_element(By.ID, "stats").text
            driver.save_screenshot(screenshot)
        finally:
            driver.quit()
    print(f"page: state {state}, answer {answer!r}, {len(cells)} canvas cells, {len(masked)} masked; {stats}")
    assert state == "done", answer
    assert answer == expected, f"the page shows {answer!r}, llada-rt run gives {expected!r}"
    assert len(cells) == 64 and not masked, "the canvas did not finish"
    print(f"browser: the page's text is llada-rt run's; screenshot {screenshot}")


if __name__ == "__main__":
    main()
