// The `icq console` browser scenario, launched by tests/console/browser.rs with:
//   CONSOLE_URL, CONSOLE_TOKEN, EXPECTED_PENDING (`icq pending --format json`), DEAD_ID,
//   XSS_ID, ENGINE, CHROMIUM (Debian's /usr/bin/chromium), SCREENSHOTS (a directory).
// playwright-core drives the system chromium; it never downloads a browser. Any failed
// check throws, and the process exits 1.
"use strict";

const assert = require("node:assert/strict");
const path = require("node:path");
const { chromium } = require("playwright-core");

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const base = env("CONSOLE_URL");
const token = env("CONSOLE_TOKEN");
const expected = JSON.parse(env("EXPECTED_PENDING"));
const deadId = env("DEAD_ID");
const xssId = env("XSS_ID");
const engine = env("ENGINE");
const shots = env("SCREENSHOTS");

const STATES = ["due", "scheduled", "running", "dead", "completed"];

async function main() {
  const browser = await chromium.launch({
    executablePath: env("CHROMIUM"),
    headless: true,
    args: ["--headless", "--no-sandbox"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const dialogs = [];
    page.on("dialog", async (dialog) => {
      dialogs.push(dialog.message());
      await dialog.dismiss();
    });
    const errors = [];
    page.on("pageerror", (err) => errors.push(String(err)));
    const shot = (name) =>
      page.screenshot({ path: path.join(shots, `${engine}-${name}.png`), fullPage: true });

    // 1. Overview: the counts equal `icq pending --format json`.
    let response = await page.goto(base + "/");
    assert.equal(response.status(), 200);
    for (const row of expected) {
      for (const state of STATES) {
        const cell = page.locator(
          `#counts td[data-source="${row.source}"][data-state="${state}"]`
        );
        assert.equal(Number(await cell.innerText()), row[state], `${row.source} ${state}`);
      }
    }
    assert.equal(await page.locator("figure.chart > svg").count(), 2, "two charts");
    await shot("overview");
    console.log("overview counts match icq pending");

    // 2. Filter by type, page forward.
    await page.goto(base + "/list");
    await page.selectOption("select[name=state]", "due");
    await page.fill("input[name=type]", "orders.receipt");
    await Promise.all([page.waitForNavigation(), page.click("form.filters button")]);
    const types = await page.locator("table.commands td.type").allInnerTexts();
    assert.equal(types.length, 25, "a full first page");
    assert.ok(types.every((t) => t === "orders.receipt"), `only the type filtered: ${types}`);
    const firstPage = await page.locator("table.commands a.id").allInnerTexts();
    await shot("list");
    await Promise.all([page.waitForNavigation(), page.click("#next-page")]);
    const secondPage = await page.locator("table.commands a.id").allInnerTexts();
    assert.equal(secondPage.length, 5, "the rest on the second page");
    assert.ok(secondPage.every((id) => !firstPage.includes(id)), "no row twice");
    assert.equal(await page.locator("#next-page").count(), 0, "the last page");
    console.log("filter and paging work");

    // 3. Open a command.
    await Promise.all([page.waitForNavigation(), page.locator("table.commands a.id").first().click()]);
    assert.equal(await page.locator("#command-id").innerText(), secondPage[0]);
    const payload = JSON.parse(await page.locator("#payload").innerText());
    assert.equal(typeof payload.order_id, "number");
    await shot("command");

    // 4. An XSS payload and last error render as text.
    await page.goto(`${base}/command?id=${xssId}`);
    assert.match(await page.locator("#payload").innerText(), /<script>window.__xss = 1<\/script>/);
    assert.match(await page.locator("#last-error").innerText(), /<script>window.__xss = 3<\/script> failed & <b>bold<\/b>/);
    assert.equal(await page.evaluate(() => window.__xss), undefined, "no injected script ran");
    assert.equal(await page.locator("main img").count(), 0, "no injected element");
    await shot("xss");
    await page.goto(base + "/dead-letters");
    assert.equal(await page.evaluate(() => window.__xss), undefined);
    await shot("dead-letters");
    console.log("XSS renders as text");

    // 5. An action without the token is refused, and nothing changes.
    await page.goto(`${base}/command?id=${deadId}`);
    assert.equal(await page.locator("#command-state").innerText(), "dead");
    await Promise.all([page.waitForNavigation(), page.click("a.button:has-text('Requeue')")]);
    assert.match(await page.locator("#question").innerText(), /Requeue 1 command/);
    await shot("confirm");
    await page.evaluate(() => document.querySelector("input[name=token]").removeAttribute("required"));
    [response] = await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
    assert.equal(response.status(), 403, "refused without the token");
    assert.match(await page.locator(".banner").innerText(), /token is missing or wrong/);
    await page.goto(`${base}/command?id=${deadId}`);
    assert.equal(await page.locator("#command-state").innerText(), "dead", "still dead");
    console.log("an action without the token is refused");

    // 6. Requeue the dead one with the token (confirmed), and see it pending.
    await Promise.all([page.waitForNavigation(), page.click("a.button:has-text('Requeue')")]);
    await page.fill("input[name=token]", token);
    [response] = await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
    assert.equal(response.status(), 200);
    assert.equal(await page.locator("#result").innerText(), "Requeued 1 command.");
    await shot("requeued");
    await Promise.all([page.waitForNavigation(), page.click("#open-command")]);
    assert.equal(await page.locator("#command-state").innerText(), "due", "pending again");
    await page.goto(base + "/");
    const dead = expected.reduce((n, row) => n + row.dead, 0);
    assert.equal(
      Number(await page.locator('#counts td[data-state="dead"]').first().innerText()),
      dead - 1
    );
    console.log("requeue with the token works");

    assert.deepEqual(dialogs, [], "no dialog opened");
    assert.deepEqual(errors, [], "no script error");
  } finally {
    await browser.close();
  }
}

main().then(
  () => console.log(`browser scenario passed on ${engine}`),
  (err) => {
    console.error(err);
    process.exit(1);
  }
);
