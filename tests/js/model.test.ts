import { describe, expect, it } from "vitest";
import { commit, getNumber, getString, getStringList, onChanges } from "../../js/ui/model";
import { FakeModel } from "./helpers/fake_model";

describe("model access", () => {
  it("falls back for missing or malformed traits", () => {
    const m = new FakeModel({ a: 3, b: "4", c: "x", s: 5, l: ["a", 1], n: null }).asModel();
    expect(getNumber(m, "a")).toBe(3);
    expect(getNumber(m, "b")).toBe(4);
    expect(getNumber(m, "c", 7)).toBe(7);
    expect(getNumber(m, "missing", 9)).toBe(9);
    expect(getNumber(m, "n", 2)).toBe(2);
    expect(getString(m, "s")).toBe("5");
    expect(getString(m, "missing", "d")).toBe("d");
    expect(getStringList(m, "l")).toEqual(["a", "1"]);
    expect(getStringList(m, "s")).toEqual([]);
  });

  it("commits several traits with one save", () => {
    const fm = new FakeModel({ a: 1 });
    commit(fm.asModel(), { a: 2, b: 3 });
    expect(fm.saves).toEqual([{ a: 2, b: 3 }]);
  });

  it("removes only its own listeners", () => {
    const fm = new FakeModel({});
    let other = 0;
    fm.on("change:a", () => other++);
    let mine = 0;
    const off = onChanges(fm.asModel(), ["a", "b"], () => mine++);
    fm.set("a", 1);
    fm.set("b", 1);
    expect([mine, other]).toEqual([2, 1]);
    off();
    fm.set("a", 2);
    expect([mine, other]).toEqual([2, 2]);
    expect(fm.listenerCount()).toBe(1);
  });
});
