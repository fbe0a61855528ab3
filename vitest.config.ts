import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["tests/js/**/*.test.ts"],
    environment: "node",
    setupFiles: ["tests/js/setup.ts"],
    pool: "threads",
    maxWorkers: 2,
  },
});
